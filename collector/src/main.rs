//! The `ember-collector` binary: everything is in the library (so that the fuzz targets reach its
//! parsers).
fn main() -> std::process::ExitCode {
    ember_collector::main()
}
