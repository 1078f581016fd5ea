fn main() {
    println!("cargo:rerun-if-changed=proto");
    if std::process::Command::new(std::env::var_os("PROTOC").unwrap_or("protoc".into()))
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("protoc is not installed (needed to compile proto/): run `cargo xtask setup`");
    }
    tonic_prost_build::configure()
        .compile_protos(&["proto/profile.proto", "proto/ember.proto"], &["proto"])
        .expect("compiling proto/*.proto");
}
