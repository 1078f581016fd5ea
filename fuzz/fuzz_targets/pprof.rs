//! pprof as agents push it: decoded (with validation), merged with itself, and drawn as every
//! view's folded stacks. The input is the protobuf; the target gzips it, so that mutations
//! reach the decoder instead of failing the gzip checksum.
#![no_main]
use std::io::Write as _;

libfuzzer_sys::fuzz_target!(init: ember_fuzz::catch_stack_overflows(), |data: &[u8]| {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).unwrap();
    let Ok(profile) = ember_pprof::decode_gzip(&gz.finish().unwrap(), 1 << 20) else { return };
    let Ok(merged) = ember_pprof::merge(&[profile.clone(), profile.clone()]) else { return };
    // Merging a profile with itself doubles every total.
    for kind in ["cpu", "offcpu", "wall", "net-tx"] {
        let view = ember_pprof::view(kind);
        if let (Ok(once), Ok(twice)) = (view.folded(&profile), view.folded(&merged)) {
            assert_eq!(2 * total(&once), total(&twice), "{kind}");
        }
    }
});

fn total(folded: &[String]) -> i128 {
    folded.iter().map(|line| line.rsplit_once(' ').and_then(|(_, n)| n.parse::<i128>().ok()).expect("a count ends each line")).sum()
}
