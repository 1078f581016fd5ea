//! gzipped profile.proto, the form profiles take on disk and on the wire.
use std::{cell::RefCell, io::Read};

use anyhow::{Context as _, Result};
use ember_proto::pprof::Profile;
use flate2::{read::GzDecoder, Compress, Compression, Crc, FlushCompress, Status};
use prost::Message;

use crate::ById;

/// A gzip member's header: deflate, no name or time, unknown OS (RFC 1952).
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

thread_local! {
    /// One deflate state per thread, reset for each profile. A new one allocates and clears
    /// some 300 KB: with three profiles an interval, some 8% of the agent's CPU (page faults
    /// included) in a profile of it at the governor's floor.
    static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new(Compression::default(), false));
}

pub fn encode_gzip(profile: &Profile) -> Vec<u8> {
    let raw = profile.encode_to_vec();
    let mut crc = Crc::new();
    crc.update(&raw);
    let mut gzip = Vec::with_capacity(GZIP_HEADER.len() + raw.len() / 4 + 64);
    gzip.extend_from_slice(&GZIP_HEADER);
    DEFLATE.with_borrow_mut(|deflate| {
        deflate.reset();
        loop {
            // `compress_vec` writes only into spare capacity.
            gzip.reserve(raw.len() / 8 + 64);
            let consumed = deflate.total_in() as usize;
            match deflate.compress_vec(&raw[consumed..], &mut gzip, FlushCompress::Finish).expect("deflating in memory") {
                Status::StreamEnd => break,
                Status::Ok | Status::BufError => {}
            }
        }
    });
    gzip.extend_from_slice(&crc.sum().to_le_bytes());
    gzip.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    gzip
}

/// Decodes untrusted bytes, with the decompressed size bounded (a gzip bomb is an error).
pub fn decode_gzip(bytes: &[u8], max_decompressed: u64) -> Result<Profile> {
    // Sized once from the trailer's length (mod 2^32, and a sender may lie: bounded by the
    // limit and by deflate's best ratio), not grown by doubling, which copies the profile
    // over and over and makes large allocations that cost glibc's malloc a consolidation each.
    let said = bytes.len().checked_sub(4).map_or(0, |at| u32::from_le_bytes(bytes[at..].try_into().expect("4 bytes")) as u64);
    let mut raw = Vec::with_capacity(said.min(max_decompressed).min(bytes.len() as u64 * 1032) as usize);
    GzDecoder::new(bytes).take(max_decompressed + 1).read_to_end(&mut raw).context("profile is not gzipped")?;
    anyhow::ensure!(raw.len() as u64 <= max_decompressed, "profile decompresses past the {} MiB limit", max_decompressed >> 20);
    decode(&raw)
}

/// A profile.proto (not gzipped), checked as `decode_gzip` checks it.
pub fn decode(raw: &[u8]) -> Result<Profile> {
    let profile = Profile::decode(raw).context("profile is not a valid profile.proto")?;
    validate(&profile)?;
    Ok(profile)
}

/// Every index and id a consumer will follow must resolve, and values and times must be
/// what a profile can hold: not negative, and an end that does not overflow.
fn validate(p: &Profile) -> Result<()> {
    anyhow::ensure!(p.time_nanos >= 0 && p.duration_nanos >= 0, "negative time or duration");
    anyhow::ensure!(p.time_nanos.checked_add(p.duration_nanos).is_some(), "time + duration overflows");
    anyhow::ensure!(p.sample.iter().all(|s| s.value.iter().all(|v| *v >= 0)), "a sample has a negative value");
    let strings = p.string_table.len() as i64;
    anyhow::ensure!(p.string_table.first().is_some_and(String::is_empty), "string_table[0] must be empty");
    let string_ok = |i: i64| (0..strings).contains(&i);
    anyhow::ensure!(p.sample_type.iter().all(|t| string_ok(t.r#type) && string_ok(t.unit)), "sample_type names a missing string");
    let functions = ById::new(&p.function, |f| f.id);
    anyhow::ensure!(p.function.iter().all(|f| string_ok(f.name) && string_ok(f.filename)), "function names a missing string");
    let mappings = ById::new(&p.mapping, |m| m.id);
    anyhow::ensure!(p.mapping.iter().all(|m| string_ok(m.filename) && string_ok(m.build_id)), "mapping names a missing string");
    for location in &p.location {
        anyhow::ensure!(location.mapping_id == 0 || mappings.get(location.mapping_id).is_some(), "location {} names a missing mapping", location.id);
        anyhow::ensure!(location.line.iter().all(|l| functions.get(l.function_id).is_some()), "location {} names a missing function", location.id);
    }
    let locations = ById::new(&p.location, |l| l.id);
    for sample in &p.sample {
        anyhow::ensure!(sample.value.len() == p.sample_type.len(), "a sample has {} values for {} sample types", sample.value.len(), p.sample_type.len());
        anyhow::ensure!(sample.location_id.iter().all(|&id| locations.get(id).is_some()), "a sample names a missing location");
        anyhow::ensure!(sample.label.iter().all(|l| string_ok(l.key) && string_ok(l.str)), "a label names a missing string");
    }
    anyhow::ensure!(p.comment.iter().all(|&c| string_ok(c)), "a comment names a missing string");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_proto::pprof::{Sample, ValueType};

    fn profile(samples: usize) -> Profile {
        Profile {
            string_table: vec![String::new(), "samples".into(), "count".into()],
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            // Varied values, so that a large profile does not compress to nothing.
            sample: (0..samples).map(|i| Sample { value: vec![(i as i64).wrapping_mul(2654435761) % 100_000], ..Default::default() }).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn profiles_encoded_one_after_another_with_one_deflate_state_decode_to_themselves() {
        // Large, small, then large again: the reset state must not carry anything over.
        for samples in [50_000, 3, 0, 50_000] {
            let p = profile(samples);
            let gzip = encode_gzip(&p);
            assert_eq!(decode_gzip(&gzip, 64 << 20).unwrap(), p, "{samples} samples");
        }
        assert_eq!(encode_gzip(&profile(1000)), encode_gzip(&profile(1000)), "the same profile, the same bytes");
    }

    #[test]
    fn a_trailer_that_lies_about_the_length_is_an_error() {
        let mut gzip = encode_gzip(&profile(1000));
        let at = gzip.len() - 4;
        for said in [0, 1, u32::MAX] {
            gzip[at..].copy_from_slice(&said.to_le_bytes());
            assert!(decode_gzip(&gzip, 64 << 20).is_err(), "length {said}");
        }
        assert!(decode_gzip(&gzip[..3], 64 << 20).is_err(), "a cut header");
    }
}
