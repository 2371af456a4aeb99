//! The respcoord wire contract as code, shared by the server and the Rust
//! client so that neither pulls in the other's dependencies: the message
//! types generated from `respcoord/v1/coordinator.proto` (with the client
//! stub under the `client` feature and the server's under `server`), the
//! codec both use, and the id rules of the contract ([`ids`]: lengths and
//! characters), enforced the same way on both sides of the wire.
//!
//! The semantics of every call and field are in `CONTRACT.md` beside this
//! crate; the lifecycle machine behind them in `PROTOCOL.md`.

pub mod codec;
pub mod ids;
pub mod timeline;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("respcoord.v1");
}

/// The encoded descriptor set, served by gRPC reflection.
#[cfg(feature = "server")]
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/respcoord_descriptor.bin"));

/// The fully qualified service name, as health checks and reflection use it.
pub const SERVICE_NAME: &str = "respcoord.v1.ResponseCoordinator";
