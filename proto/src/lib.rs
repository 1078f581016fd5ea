//! Ember's wire formats, generated from the .proto files in `proto/`.

/// pprof's profile.proto: the profile unit Ember writes and ships.
pub mod pprof {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}
