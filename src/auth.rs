//! Bearer-token authentication with per-token session scopes.
//!
//! Tokens come from a file (`--auth-tokens`), one per line, each optionally
//! limited to a session id prefix:
//!
//! ```text
//! # TOKEN                            SCOPE (a session id prefix; `*` or nothing: every session)
//! 3f1c9a7e5b2d4c6e8a0b1c2d3e4f5a6b   tenant-a/
//! 9b8a7c6d5e4f3a2b1c0d9e8f7a6b5c4d   *
//! ```
//!
//! [`Authenticator`] is the interceptor in front of the coordinator service:
//! a call without a recognised `authorization: Bearer <token>` is
//! UNAUTHENTICATED; an authenticated call carries its token's
//! [`SessionScope`] in the request extensions, which the service reads with
//! [`caller_scope`] and enforces with [`authorize`] (PERMISSION_DENIED
//! outside it; listings and watch-all are filtered to it). Health and
//! reflection are not behind it, so probes need no token.
//!
//! It fails closed: the interceptor records a scope on every call it lets
//! through (every session when authentication is off), and a call that
//! carries none is refused, so a service wired up without the interceptor
//! opens no session instead of all of them.
//!
//! Secrets never leave this module: [`Tokens`]' `Debug` shows a count, errors
//! about the file name line numbers only, and nothing here logs a token.

use std::{fmt, path::Path, sync::Arc};

use subtle::ConstantTimeEq;
use tonic::{service::Interceptor, Request, Status};

use crate::ids::{SessionId, SessionScope};

/// Shortest token accepted: guessing one must be hopeless.
pub const MIN_TOKEN_LEN: usize = 16;

struct Entry {
    token: Box<[u8]>,
    scope: SessionScope,
}

/// The accepted tokens and their scopes. Cheap to clone.
#[derive(Clone)]
pub struct Tokens(Arc<[Entry]>);

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the tokens themselves.
        f.debug_struct("Tokens")
            .field("count", &self.0.len())
            .finish()
    }
}

/// Why a token file was refused. Names lines, never their contents.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read: {0}")]
    Read(#[from] std::io::Error),
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error("no tokens (every line is empty or a # comment)")]
    Empty,
}

impl Tokens {
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        Self::parse(&std::fs::read_to_string(path)?)
    }

    /// Parses the file format above. Tokens are printable ASCII without
    /// spaces, at least [`MIN_TOKEN_LEN`] long, each listed once.
    pub fn parse(text: &str) -> Result<Self, TokenFileError> {
        let mut entries: Vec<(usize, Entry)> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let bad = |reason: &str| TokenFileError::Line {
                line,
                reason: reason.to_owned(),
            };
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let mut fields = content.split_whitespace();
            let (Some(token), scope, None) = (fields.next(), fields.next(), fields.next()) else {
                return Err(bad("expected `TOKEN [SCOPE]`"));
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(bad(&format!(
                    "token is shorter than {MIN_TOKEN_LEN} characters"
                )));
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad("token must be printable ASCII"));
            }
            let scope = match scope {
                None | Some("*") => SessionScope::All,
                Some(prefix) => {
                    SessionScope::prefix(prefix).map_err(|e| bad(&format!("scope prefix {e}")))?
                }
            };
            if let Some((first, _)) = entries
                .iter()
                .find(|(_, entry)| *entry.token == *token.as_bytes())
            {
                return Err(bad(&format!("token already listed on line {first}")));
            }
            entries.push((
                line,
                Entry {
                    token: token.as_bytes().into(),
                    scope,
                },
            ));
        }
        if entries.is_empty() {
            return Err(TokenFileError::Empty);
        }
        Ok(Self(entries.into_iter().map(|(_, e)| e).collect()))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The scope of `presented`, if it is a known token. Every entry is
    /// compared in constant time, so timing does not reveal a prefix match.
    pub fn scope_of(&self, presented: &[u8]) -> Option<&SessionScope> {
        let mut found = None;
        for entry in self.0.iter() {
            if bool::from(entry.token.ct_eq(presented)) {
                found = Some(&entry.scope);
            }
        }
        found
    }
}

/// A refused call, before or after authentication. Mapped to a status in
/// `grpc::status`; messages never contain a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    // Worded for gRPC metadata and the web view's HTTP header alike.
    #[error("missing credentials: send `authorization: Bearer <token>`")]
    Missing,
    #[error("the authorization value must be `Bearer <token>`")]
    Malformed,
    #[error("the bearer token is not recognized")]
    Unknown,
    #[error("session_id: {session_id:?} is outside this token's scope ({scope})")]
    OutOfScope {
        session_id: SessionId,
        scope: SessionScope,
    },
    /// The call reached the service without passing the [`Authenticator`]:
    /// nobody checked who is calling. A server wiring fault, refused rather
    /// than served with every session in scope.
    #[error("the call was not authenticated (no caller scope recorded); refused")]
    NotAuthenticated,
}

/// The interceptor in front of the coordinator service. Without tokens
/// (auth disabled) it lets every call through with the every-session scope.
#[derive(Clone, Debug, Default)]
pub struct Authenticator {
    tokens: Option<Tokens>,
}

impl Authenticator {
    pub fn new(tokens: Option<Tokens>) -> Self {
        Self { tokens }
    }

    /// The scope of the credentials in `metadata`: every session when
    /// authentication is off.
    pub fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<SessionScope, AuthError> {
        self.authenticate_headers(metadata.as_ref())
    }

    /// [`Authenticator::authenticate`] over a call's HTTP/2 headers.
    pub fn authenticate_headers(
        &self,
        headers: &http::HeaderMap,
    ) -> Result<SessionScope, AuthError> {
        let Some(tokens) = &self.tokens else {
            return Ok(SessionScope::All);
        };
        let value = headers
            .get(http::header::AUTHORIZATION)
            .ok_or(AuthError::Missing)?
            .to_str()
            .map_err(|_| AuthError::Malformed)?;
        let (scheme, token) = value.trim().split_once(' ').ok_or(AuthError::Malformed)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::Malformed);
        }
        tokens
            .scope_of(token.trim().as_bytes())
            .cloned()
            .ok_or(AuthError::Unknown)
    }
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let scope = self.authenticate(request.metadata())?;
        request.extensions_mut().insert(CallerScope(scope));
        Ok(request)
    }
}

/// The [`Authenticator`] in front of a gRPC service, as a tower service
/// over the HTTP request: it records the caller's scope in the request's
/// extensions, or answers the refusal itself. The same as tonic's
/// `InterceptedService` with the authenticator, without taking the request
/// apart into a tonic `Request` and building it again and wrapping the
/// response body once more (about 700 instructions a call; issue 43).
#[derive(Clone, Debug)]
pub struct Authenticated<S> {
    inner: S,
    authenticator: Authenticator,
}

impl<S> Authenticated<S> {
    pub fn new(inner: S, authenticator: Authenticator) -> Self {
        Self {
            inner,
            authenticator,
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<B>> for Authenticated<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures_util::future::Either<
        S::Future,
        std::future::Ready<Result<http::Response<tonic::body::Body>, S::Error>>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        use futures_util::future::Either;
        match self.authenticator.authenticate_headers(request.headers()) {
            Ok(scope) => {
                request.extensions_mut().insert(CallerScope(scope));
                Either::Left(self.inner.call(request))
            }
            Err(error) => Either::Right(std::future::ready(Ok(Status::from(error).into_http()))),
        }
    }
}

/// The authenticated caller's scope, as the interceptor leaves it in the
/// request extensions. Private: only [`Authenticator`] can grant one.
#[derive(Clone, Debug)]
struct CallerScope(SessionScope);

/// The scope a call may act in, as the interceptor recorded it: its token's,
/// or every session when authentication is off. A call without one did not
/// pass the interceptor and is refused ([`AuthError::NotAuthenticated`]):
/// the absence of a scope never widens into every session.
pub fn caller_scope<T>(request: &Request<T>) -> Result<SessionScope, AuthError> {
    match request.extensions().get::<CallerScope>() {
        Some(caller) => Ok(caller.0.clone()),
        None => {
            // Loud: this is a server wiring fault, not a caller's mistake.
            tracing::error!("a call reached the service without the authenticator; refused");
            Err(AuthError::NotAuthenticated)
        }
    }
}

/// PERMISSION_DENIED unless `session_id` is in `scope`.
pub fn authorize(scope: &SessionScope, session_id: &SessionId) -> Result<(), AuthError> {
    if scope.contains(session_id) {
        Ok(())
    } else {
        Err(AuthError::OutOfScope {
            session_id: session_id.clone(),
            scope: scope.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "token-for-tenant-a-0001";
    const ADMIN: &str = "token-for-the-operator-01";

    fn metadata(value: &str) -> tonic::metadata::MetadataMap {
        let mut map = tonic::metadata::MetadataMap::new();
        map.insert("authorization", value.parse().unwrap());
        map
    }

    #[test]
    fn parses_tokens_scopes_and_comments() {
        let tokens = Tokens::parse(&format!(
            "# comment\n\n  {A}  tenant-a/\n{ADMIN} *\nplain-token-without-scope\n"
        ))
        .unwrap();
        assert_eq!(tokens.len(), 3);
        assert_eq!(
            tokens.scope_of(A.as_bytes()),
            Some(&SessionScope::prefix("tenant-a/").unwrap())
        );
        assert_eq!(tokens.scope_of(ADMIN.as_bytes()), Some(&SessionScope::All));
        assert_eq!(
            tokens.scope_of(b"plain-token-without-scope"),
            Some(&SessionScope::All)
        );
        assert_eq!(tokens.scope_of(b"token-for-tenant-a-000"), None);
        assert_eq!(tokens.scope_of(b""), None);
    }

    #[test]
    fn refusals_name_the_line_and_never_the_token() {
        let cases = [
            ("short\n", "line 1: token is shorter"),
            (&format!("# x\n{A} a b\n") as &str, "line 2: expected"),
            (&format!("{A} bad\u{7}scope\n"), "line 1: scope prefix"),
            (
                &format!("{A}\n{A}\n"),
                "line 2: token already listed on line 1",
            ),
            ("# nothing\n", "no tokens"),
        ];
        for (text, expected) in cases {
            let error = Tokens::parse(text).unwrap_err().to_string();
            assert!(error.starts_with(expected), "{text:?}: {error}");
            assert!(!error.contains(A), "{error}");
        }
        assert!(!format!("{:?}", Tokens::parse(A).unwrap()).contains(A));
    }

    #[test]
    fn authenticates_bearer_tokens() {
        let auth = Authenticator::new(Some(Tokens::parse(&format!("{A} tenant-a/")).unwrap()));
        let scope = SessionScope::prefix("tenant-a/").unwrap();
        assert_eq!(
            auth.authenticate(&metadata(&format!("Bearer {A}"))),
            Ok(scope.clone())
        );
        assert_eq!(
            auth.authenticate(&metadata(&format!("bearer  {A} "))),
            Ok(scope)
        );
        assert_eq!(
            auth.authenticate(&tonic::metadata::MetadataMap::new()),
            Err(AuthError::Missing)
        );
        assert_eq!(
            auth.authenticate(&metadata(&format!("Basic {A}"))),
            Err(AuthError::Malformed)
        );
        assert_eq!(auth.authenticate(&metadata(A)), Err(AuthError::Malformed));
        assert_eq!(
            auth.authenticate(&metadata("Bearer not-a-known-token-at-all")),
            Err(AuthError::Unknown)
        );
        let open = Authenticator::new(None);
        assert_eq!(
            open.authenticate(&tonic::metadata::MetadataMap::new()),
            Ok(SessionScope::All)
        );
    }

    /// The interceptor records a scope on every call it passes, also with
    /// authentication off; a call it never saw has none and is refused.
    #[test]
    fn caller_scope_fails_closed() {
        assert_eq!(
            caller_scope(&Request::new(())),
            Err(AuthError::NotAuthenticated)
        );
        let mut open = Authenticator::new(None);
        let passed = open.call(Request::new(())).expect("auth off lets it in");
        assert_eq!(caller_scope(&passed), Ok(SessionScope::All));
        let mut scoped =
            Authenticator::new(Some(Tokens::parse(&format!("{A} tenant-a/")).unwrap()));
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {A}").parse().unwrap());
        let passed = scoped.call(request).expect("a known token");
        assert_eq!(
            caller_scope(&passed),
            Ok(SessionScope::prefix("tenant-a/").unwrap())
        );
    }

    #[test]
    fn authorize_checks_the_prefix() {
        let scope = SessionScope::prefix("tenant-a/").unwrap();
        let inside = SessionId::parse("tenant-a/1").unwrap();
        let outside = SessionId::parse("tenant-b/1").unwrap();
        assert_eq!(authorize(&scope, &inside), Ok(()));
        let error = authorize(&scope, &outside).unwrap_err();
        assert!(error.to_string().starts_with("session_id: "), "{error}");
        assert_eq!(authorize(&SessionScope::All, &outside), Ok(()));
    }
}
