//! Code generated from `proto/respcoord/v1/coordinator.proto` at build time.
//! Only the `grpc` module (and clients) use these types; the domain never does.

pub mod codec;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("respcoord.v1");
}

/// The encoded descriptor set, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/respcoord_descriptor.bin"));

/// The fully qualified service name, as health checks and reflection use it.
pub const SERVICE_NAME: &str = "respcoord.v1.ResponseCoordinator";
