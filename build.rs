//! Compiles `proto/` with protox (pure Rust), so building needs no system `protoc`.
//! The encoded descriptor set is also written out for gRPC server reflection.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/respcoord/v1/coordinator.proto";
    println!("cargo:rerun-if-changed={proto}");

    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_source_info(true).open_file(proto)?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("respcoord_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Buffers sized for watches held open for a whole call.
        .codec_path("crate::proto::codec::Codec")
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
