fn main() {
    println!("cargo:rerun-if-changed=proto");
    if std::process::Command::new(std::env::var_os("PROTOC").unwrap_or("protoc".into()))
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("protoc is not installed (needed to compile proto/): run `cargo xtask setup`");
    }
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("ember_descriptor.bin");
    tonic_prost_build::configure()
        // For gRPC reflection: tools like grpcurl discover the services from the server.
        .file_descriptor_set_path(descriptors)
        .compile_protos(&["proto/profile.proto", "proto/ember.proto"], &["proto"])
        .expect("compiling proto/*.proto");
}
