//! No function in `src/` runs over [`MAX_LINES`] lines, except those
//! allowed below (issue 31): a long function is split into named steps.
//!
//! A deliberately small scanner rather than a Rust parser: it blanks out
//! comments, string and character literals (so braces inside them do not
//! count), finds each `fn name` item, and follows its body's braces to the
//! one that closes it. A function's length is from the line of `fn` to the
//! line of that brace, both included; a function nested in another counts
//! for both. Trait methods without a body have no length.

use std::{
    fs,
    path::{Path, PathBuf},
};

const MAX_LINES: usize = 80;

/// Functions allowed to run longer, as `(path from the crate root, name)`.
const ALLOWED: &[(&str, &str)] = &[
    // The transition table: every (phase, call) row the machine must
    // produce, read as a table (`machine::transition` itself is shorter).
    ("src/machine/tests.rs", "table"),
];

#[test]
fn no_function_in_src_is_over_80_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(!files.is_empty(), "no sources found under src/");
    let mut too_long = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        let source = fs::read_to_string(&file).expect("readable source");
        for function in functions(&source) {
            let allowed = ALLOWED
                .iter()
                .any(|&(path, name)| path == relative && name == function.name);
            if function.lines > MAX_LINES && !allowed {
                too_long.push(format!(
                    "{relative}:{} fn {} is {} lines",
                    function.line, function.name, function.lines
                ));
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "functions over {MAX_LINES} lines (split them into named steps):\n{}",
        too_long.join("\n")
    );
}

#[test]
fn the_scanner_measures_what_it_should() {
    let source = r##"
// fn commented_out() { {{{ }
/* fn in_a_block_comment() { /* nested */ { */
trait T {
    fn declared(&self) -> u32;
}
fn short<'a>(x: &'a str) -> char {
    let _ = "{ not a brace }";
    let _ = r#"{ "raw" }"#;
    let _ = '{';
    let _ = '\'';
    let _: fn(u32) -> u32 = |x| x;
    'x'
}
impl S {
    pub(crate) async fn method(&self)
    where
        Self: Sized,
    {
        fn inner() {}
    }
}
"##;
    let found: Vec<_> = functions(source)
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    assert_eq!(
        found,
        [
            ("short".to_owned(), 7, 14 - 7 + 1),
            ("method".to_owned(), 16, 21 - 16 + 1),
            ("inner".to_owned(), 20, 1),
        ]
    );
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("readable directory")
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

struct Function {
    name: String,
    /// 1-based line of `fn`.
    line: usize,
    lines: usize,
}

/// Every `fn` item with a body in `source`.
fn functions(source: &str) -> Vec<Function> {
    let code = blank_out(source);
    let chars: Vec<char> = code.chars().collect();
    let line_of = |index: usize| 1 + chars[..index].iter().filter(|&&c| c == '\n').count();
    let mut found = Vec::new();
    for start in 0..chars.len() {
        let Some(name) = fn_name_at(&chars, start) else {
            continue;
        };
        let Some(open) = body_start(&chars, start) else {
            continue;
        };
        let Some(close) = matching_brace(&chars, open) else {
            continue;
        };
        let line = line_of(start);
        found.push(Function {
            name,
            line,
            lines: line_of(close) - line + 1,
        });
    }
    found
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The name if `fn <name>` starts at `at`.
fn fn_name_at(chars: &[char], at: usize) -> Option<String> {
    if chars.get(at..at + 2)? != ['f', 'n'] || (at > 0 && is_ident(chars[at - 1])) {
        return None;
    }
    let mut i = at + 2;
    if !chars.get(i)?.is_whitespace() {
        return None;
    }
    while chars.get(i)?.is_whitespace() {
        i += 1;
    }
    let name: String = chars[i..].iter().take_while(|&&c| is_ident(c)).collect();
    (!name.is_empty()).then_some(name)
}

/// The `{` opening the body of the `fn` at `at`, or `None` for a
/// declaration (`;` first).
fn body_start(chars: &[char], at: usize) -> Option<usize> {
    let mut depth = 0_i32;
    for (i, &c) in chars.iter().enumerate().skip(at) {
        match c {
            '(' | '[' | '<' => depth += 1,
            ')' | ']' => depth -= 1,
            // `->` is not a closing angle bracket.
            '>' if i > 0 && chars[i - 1] != '-' => depth -= 1,
            '{' if depth <= 0 => return Some(i),
            ';' if depth <= 0 => return None,
            _ => {}
        }
    }
    None
}

fn matching_brace(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0_usize;
    for (i, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `source` with comments and the insides of string and character
/// literals replaced by spaces (newlines kept, so lines still count).
fn blank_out(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_at(&chars, i) {
            // r#"..."#: skip to a quote followed by as many hashes.
            i += 2 + hashes;
            while i < chars.len()
                && !(chars[i] == '"' && chars[i + 1..].iter().take(hashes).all(|&h| h == '#'))
            {
                blank(&mut out, chars[i]);
                i += 1;
            }
            i += 1 + hashes;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if let Some(&inner) = chars.get(i) {
                    blank(&mut out, inner);
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            // An escaped character literal: '\n', '\'', '\u{7f}'.
            i += 3;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
        } else {
            // Code, and a lifetime's quote.
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The number of `#`s if a raw string (`r"`, `r#"`, `br#"`) starts at `at`.
fn raw_string_at(chars: &[char], at: usize) -> Option<usize> {
    let mut i = at;
    if chars.get(i) == Some(&'b') {
        i += 1;
    }
    if chars.get(i) != Some(&'r') || (at > 0 && is_ident(chars[at - 1])) {
        return None;
    }
    i += 1;
    let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
    (chars.get(i + hashes) == Some(&'"')).then_some(hashes)
}
