//! Ember's wire formats, generated from the .proto files in `proto/`.

/// pprof's profile.proto: the profile unit Ember writes and ships.
pub mod pprof {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// Ember's gRPC services (collector push, agent pull) and their messages.
pub mod ember {
    include!(concat!(env!("OUT_DIR"), "/ember.v1.rs"));
}

/// Encoded descriptors of every message and service above, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ember_descriptor.bin"));

pub mod backoff;
pub mod http_client;
pub mod security;
