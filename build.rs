//! Compiles the vendored Dataproc and long-running-operations protos
//! (proto/, see proto/README.md) with protox, a pure-Rust protobuf
//! compiler, so a build needs no protoc. Two products:
//! - the gRPC *server* stubs of `BatchController` and `Operations`
//!   (tonic-prost-build); their messages are not generated here but taken
//!   from the maintained googleapis-tonic crates (extern paths);
//! - the encoded descriptor set, for server reflection and for the proto3
//!   JSON transcoding between the REST shapes and the gRPC messages.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "google/cloud/dataproc/v1/batches.proto",
    "google/cloud/dataproc/v1/operations.proto",
    "google/longrunning/operations.proto",
    "google/rpc/status.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::Compiler::new(["proto"])?
        .include_imports(true)
        .open_files(PROTOS)?
        .file_descriptor_set();
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("flexq_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .codec_path("crate::grpc::codec::Codec")
        .extern_path(
            ".google.cloud.dataproc.v1",
            "::googleapis_tonic_google_cloud_dataproc_v1::google::cloud::dataproc::v1",
        )
        .extern_path(
            ".google.longrunning",
            "::googleapis_tonic_google_longrunning::google::longrunning",
        )
        .extern_path(".google.rpc", "::googleapis_tonic_google_rpc::google::rpc")
        .extern_path(".google.api", "::googleapis_tonic_google_api::google::api")
        .compile_fds(fds)?;
    Ok(())
}
