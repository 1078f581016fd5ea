//! Compiles proto/*.proto with protox, a protobuf compiler in Rust: building Ember needs no
//! system `protoc` (a fresh machine has none, and `cargo xtask setup` needs this crate built).
use prost::Message as _;

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["proto/profile.proto", "proto/ember.proto"], ["proto"])
        .unwrap_or_else(|error| panic!("compiling proto/*.proto: {error}"));
    // For gRPC reflection: tools like grpcurl discover the services from the server.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("ember_descriptor.bin");
    std::fs::write(&out, descriptors.encode_to_vec()).expect("writing the descriptor set");
    tonic_prost_build::configure().compile_fds(descriptors).expect("generating Rust from proto/*.proto");
}
