//! The spool: every profile to push is first written here, numbered, so nothing is lost while
//! the collector is down or when the agent restarts; the pusher sends the oldest first and
//! deletes what the collector has stored. The spool is bounded: past its size the oldest
//! profiles are dropped, and counted.
//!
//! A profile counts as spooled once its file is synced to disk under its final name (see
//! `write_atomic`). Each file carries a checksum: one damaged on disk is moved to
//! `quarantine/` and counted, never sent and never left to block the files after it. A write
//! a crash interrupted leaves a `.tmp` file, removed (and counted) at the next start.
use std::{
    fs,
    path::{Path, PathBuf},
    sync::Mutex,
};

use anyhow::{Context as _, Result};
use ember_proto::ember::Profile;
use prost::Message;

use super::files::{write_atomic, PARTIAL};
use crate::ops::metrics;

const NEXT_SEQUENCE: &str = "next-sequence";
/// The spool's random id: sequence numbers count within it (see ember.proto).
const SPOOL_ID: &str = "spool-id";
const EXTENSION: &str = "profile";
const QUARANTINE: &str = "quarantine";
/// A spool file: MAGIC, the format's version (two ASCII digits), the encoded profile's length
/// and CRC-32 (little-endian u32s), then the profile. Anything else is damaged: a file is
/// sent only if every byte of it checks.
const MAGIC: &[u8; 6] = b"EMBSPL";
const VERSION: &[u8; 2] = b"01";
const HEADER: usize = MAGIC.len() + VERSION.len() + 8;

pub struct Spool {
    /// The sink it feeds ("collector", "pull", "otlp"), for logs and metrics.
    sink: &'static str,
    dir: PathBuf,
    max_bytes: u64,
    /// Pull mode: keep only the newest this many (collectors fetch, nobody deletes).
    max_count: usize,
    id: u64,
    state: Mutex<State>,
}

struct State {
    next_sequence: u64,
    /// Dropped because the spool was full.
    pub dropped: u64,
    /// The batch a shipper is sending (`take_batch`), and those of it dropped to make room
    /// meanwhile: their loss is counted only if the sink does not acknowledge them.
    sending: Vec<u64>,
    dropped_sending: Vec<u64>,
}

impl Spool {
    pub fn open(dir: &Path, sink: &'static str, max_bytes: u64, max_count: usize) -> Result<Spool> {
        fs::create_dir_all(dir).with_context(|| format!("creating spool directory {}", dir.display()))?;
        Self::remove_interrupted(dir, sink)?;
        let stored = fs::read_to_string(dir.join(NEXT_SEQUENCE)).ok().and_then(|s| s.trim().parse().ok());
        // The counter file is written before any profile file, so it is never behind; the
        // scan only matters if it was lost.
        let files = Self::files(dir)?;
        let highest = files.last().map(|(seq, _)| *seq).unwrap_or(0);
        let next_sequence = stored.unwrap_or(1).max(highest + 1);
        let id = Self::id_of(dir)?;
        let spool = Spool { sink, dir: dir.to_path_buf(), max_bytes, max_count, id, state: Mutex::new(State { next_sequence, dropped: 0, sending: Vec::new(), dropped_sending: Vec::new() }) };
        spool.report(files.len(), bytes(&files));
        Ok(spool)
    }

    /// The spool's id, made (random, never 0) the first time the directory is a spool.
    fn id_of(dir: &Path) -> Result<u64> {
        let path = dir.join(SPOOL_ID);
        if let Some(id) = fs::read_to_string(&path).ok().and_then(|s| u64::from_str_radix(s.trim(), 16).ok()).filter(|id| *id != 0) {
            return Ok(id);
        }
        let mut bytes = [0u8; 8];
        std::io::Read::read_exact(&mut fs::File::open("/dev/urandom").context("opening /dev/urandom")?, &mut bytes)?;
        let id = u64::from_le_bytes(bytes).max(1);
        write_atomic(&path, format!("{id:016x}").as_bytes())?;
        Ok(id)
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Removes writes a crash interrupted: their profiles never counted as spooled, and were
    /// lost with the process that was writing them.
    fn remove_interrupted(dir: &Path, sink: &'static str) -> Result<()> {
        for entry in fs::read_dir(dir).with_context(|| format!("reading spool {}", dir.display()))?.flatten() {
            let (path, name) = (entry.path(), entry.file_name().to_string_lossy().into_owned());
            if !name.ends_with(&format!(".{PARTIAL}")) {
                continue;
            }
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            if name.ends_with(&format!(".{EXTENSION}.{PARTIAL}")) {
                metrics::add("ember_lost_total", &[("reason", "spool_write_interrupted"), ("sink", sink)], 1.0);
                tracing::warn!(sink, file = %path.display(), "a profile's spool write was interrupted (crash): removed its partial file");
            }
        }
        Ok(())
    }

    /// Moves a damaged file out of the spool, where a person can look at it.
    fn quarantine(&self, path: &Path, error: &str) -> Result<()> {
        let dir = self.dir.join(QUARANTINE);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let to = dir.join(path.file_name().unwrap_or_default());
        fs::rename(path, &to).with_context(|| format!("moving {} to {}", path.display(), to.display()))?;
        metrics::add("ember_lost_total", &[("reason", "spool_corrupt"), ("sink", self.sink)], 1.0);
        tracing::error!(sink = self.sink, file = %to.display(), "corrupt spool file moved aside, not sent: {error}");
        Ok(())
    }

    /// Spooled files, oldest first.
    fn files(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
        let mut files: Vec<(u64, PathBuf)> = fs::read_dir(dir)
            .with_context(|| format!("reading spool {}", dir.display()))?
            .flatten()
            .filter_map(|e| {
                let path = e.path();
                let seq = path.extension().filter(|x| *x == EXTENSION).and(path.file_stem())?.to_str()?.parse().ok()?;
                Some((seq, path))
            })
            .collect();
        files.sort();
        Ok(files)
    }

    /// Numbers the profile and writes it to disk; returns its sequence number.
    pub fn append(&self, mut profile: Profile) -> Result<u64> {
        let mut state = self.state.lock().expect("spool lock");
        profile.sequence = state.next_sequence;
        state.next_sequence += 1;
        write_atomic(&self.dir.join(NEXT_SEQUENCE), state.next_sequence.to_string().as_bytes())?;
        let path = self.dir.join(format!("{:020}.{EXTENSION}", profile.sequence));
        write_atomic(&path, &encode(&profile))?;
        let mut files = Self::files(&self.dir)?;
        let mut total = bytes(&files);
        while (total > self.max_bytes || files.len() > self.max_count) && files.len() > 1 {
            let (seq, oldest) = files.remove(0);
            total -= fs::metadata(&oldest).map(|m| m.len()).unwrap_or(0);
            fs::remove_file(&oldest).with_context(|| format!("dropping {}", oldest.display()))?;
            if state.sending.contains(&seq) {
                state.dropped_sending.push(seq); // lost only if the send fails
            } else {
                self.count_dropped(&mut state, seq);
            }
        }
        self.report(files.len(), total);
        Ok(profile.sequence)
    }

    fn count_dropped(&self, state: &mut State, sequence: u64) {
        state.dropped += 1;
        metrics::add("ember_lost_total", &[("reason", "spool_full"), ("sink", self.sink)], 1.0);
        tracing::warn!(sink = self.sink, sequence, dropped_total = state.dropped, "spool full: dropped the oldest profile");
    }

    /// The oldest `limit` profiles, for a shipper to send: until it says how the send went
    /// (`remove` or `send_failed`), those dropped to make room are not counted lost yet.
    pub fn take_batch(&self, limit: usize) -> Result<Vec<Profile>> {
        let mut state = self.state.lock().expect("spool lock");
        let profiles = self.read_after(0, limit)?;
        state.sending = profiles.iter().map(|p| p.sequence).collect();
        state.dropped_sending.clear();
        Ok(profiles)
    }

    /// The batch being sent did not arrive: what was dropped of it meanwhile is lost.
    pub fn send_failed(&self) {
        let mut state = self.state.lock().expect("spool lock");
        self.settle(&mut state, &[]);
    }

    /// Ends the send of the batch: what was dropped of it meanwhile and is not among
    /// `acknowledged` is counted lost. Returns how many of it were dropped and acknowledged.
    fn settle(&self, state: &mut State, acknowledged: &[u64]) -> usize {
        let (arrived, lost): (Vec<u64>, Vec<u64>) = std::mem::take(&mut state.dropped_sending).into_iter().partition(|seq| acknowledged.contains(seq));
        for sequence in lost {
            self.count_dropped(state, sequence);
        }
        state.sending.clear();
        arrived.len()
    }

    pub fn sink(&self) -> &'static str {
        self.sink
    }

    /// Sets the spool's size metrics.
    fn report(&self, profiles: usize, bytes: u64) {
        metrics::set("ember_spool_profiles", &[("sink", self.sink)], profiles as f64);
        metrics::set("ember_spool_bytes", &[("sink", self.sink)], bytes as f64);
    }

    /// Up to `limit` spooled profiles, oldest first.
    #[cfg(test)]
    pub fn oldest(&self, limit: usize) -> Result<Vec<Profile>> {
        self.after(0, limit)
    }

    /// Up to `limit` spooled profiles numbered after `sequence`, oldest first. Damaged files
    /// are quarantined on the way.
    pub fn after(&self, sequence: u64, limit: usize) -> Result<Vec<Profile>> {
        let _state = self.state.lock().expect("spool lock");
        self.read_after(sequence, limit)
    }

    /// `after`, with the lock held.
    fn read_after(&self, sequence: u64, limit: usize) -> Result<Vec<Profile>> {
        let mut profiles = Vec::new();
        for (_, path) in Self::files(&self.dir)?.into_iter().filter(|(seq, _)| *seq > sequence) {
            if profiles.len() == limit {
                break;
            }
            let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            match decode(&bytes) {
                Ok(profile) => profiles.push(profile),
                Err(error) => self.quarantine(&path, &error)?,
            }
        }
        Ok(profiles)
    }

    /// Forgets these profiles, which the sink acknowledged; returns how many of them it
    /// forgot, or had dropped while they were being sent (they arrived: not lost). What was
    /// dropped of the batch being sent and not acknowledged is counted lost.
    pub fn remove(&self, sequences: &[u64]) -> Result<usize> {
        let mut state = self.state.lock().expect("spool lock");
        let (mut left, mut removed) = (Vec::new(), self.settle(&mut state, sequences));
        for (seq, path) in Self::files(&self.dir)? {
            if sequences.contains(&seq) {
                fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
                removed += 1;
            } else {
                left.push((seq, path));
            }
        }
        self.report(left.len(), bytes(&left));
        Ok(removed)
    }
}

fn encode(profile: &Profile) -> Vec<u8> {
    let body = profile.encode_to_vec();
    let mut bytes = Vec::with_capacity(HEADER + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(VERSION);
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes
}

fn decode(bytes: &[u8]) -> Result<Profile, String> {
    let word = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
    let Some(rest) = bytes.strip_prefix(MAGIC) else { return Err("no spool header".into()) };
    let Some(rest) = rest.strip_prefix(VERSION) else {
        let version = String::from_utf8_lossy(&rest[..rest.len().min(VERSION.len())]).into_owned();
        return Err(format!("spool format {version:?}, this agent reads {:?}", std::str::from_utf8(VERSION).expect("ASCII")));
    };
    if rest.len() < 8 {
        return Err("truncated header".into());
    }
    let (length, crc, body) = (word(&rest[..4]), word(&rest[4..8]), &rest[8..]);
    if body.len() != length as usize {
        return Err(format!("{} bytes of profile, the header says {length}", body.len()));
    }
    if crc32fast::hash(body) != crc {
        return Err("checksum mismatch".into());
    }
    Profile::decode(body).map_err(|e| format!("undecodable profile: {e}"))
}

/// Total size of spooled files.
fn bytes(files: &[(u64, PathBuf)]) -> u64 {
    files.iter().filter_map(|(_, p)| fs::metadata(p).ok()).map(|m| m.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(bytes: usize) -> Profile {
        Profile { kind: "cpu".into(), pprof_gzip: vec![1; bytes], ..Default::default() }
    }

    #[test]
    fn damaged_files_are_quarantined_and_interrupted_writes_removed() {
        let dir = std::env::temp_dir().join(format!("ember-spool-damage-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let spool = Spool::open(&dir, "test", u64::MAX, usize::MAX).unwrap();
        for _ in 0..7 {
            spool.append(profile(100)).unwrap();
        }
        let file = |seq: u64| dir.join(format!("{seq:020}.{EXTENSION}"));
        let damage = |seq: u64, how: &dyn Fn(&mut Vec<u8>)| {
            let mut bytes = fs::read(file(seq)).unwrap();
            how(&mut bytes);
            fs::write(file(seq), bytes).unwrap();
        };
        // Profile 2: one bit flipped in its body; 3: cut short; 4: one bit flipped in the
        // magic; 5: a bare profile, with no header; 6: a format this agent does not read.
        damage(2, &|b| b[HEADER + 10] ^= 0x10);
        damage(3, &|b| b.truncate(b.len() - 1));
        damage(4, &|b| b[1] ^= 0x01);
        damage(5, &|b| *b = b.split_off(HEADER));
        damage(6, &|b| b[MAGIC.len() + 1] = b'2');
        fs::write(dir.join(format!("{:020}.{EXTENSION}.{PARTIAL}", 8)), b"half").unwrap();
        let spool = Spool::open(&dir, "test", u64::MAX, usize::MAX).unwrap();
        assert!(!dir.join(format!("{:020}.{EXTENSION}.{PARTIAL}", 8)).exists(), "the interrupted write is removed");
        let sent: Vec<u64> = spool.oldest(10).unwrap().iter().map(|p| p.sequence).collect();
        assert_eq!(sent, [1, 7], "the damaged files do not block the ones after them");
        let quarantined: Vec<String> =
            fs::read_dir(dir.join(QUARANTINE)).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(quarantined.len(), 5, "{quarantined:?}");
        let newer = fs::read(dir.join(QUARANTINE).join(file(6).file_name().unwrap())).unwrap();
        assert_eq!(decode(&newer).unwrap_err(), r#"spool format "02", this agent reads "01""#);
        assert_eq!(spool.append(profile(10)).unwrap(), 8, "numbering goes on past the quarantined files");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A profile dropped to make room while it was being sent is lost only if the send
    /// fails: one the sink acknowledges arrived.
    #[test]
    fn a_profile_dropped_while_it_is_sent_is_lost_only_if_the_send_fails() {
        let dir = std::env::temp_dir().join(format!("ember-spool-sending-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let spool = Spool::open(&dir, "test", 5_000, usize::MAX).unwrap();
        spool.append(profile(4_000)).unwrap();
        let batch: Vec<u64> = spool.take_batch(10).unwrap().iter().map(|p| p.sequence).collect();
        assert_eq!(batch, [1]);
        spool.append(profile(4_000)).unwrap(); // drops 1, being sent
        assert_eq!(spool.state.lock().unwrap().dropped, 0, "not lost yet");
        assert_eq!(spool.remove(&[1]).unwrap(), 1, "acknowledged: it arrived");
        assert_eq!(spool.state.lock().unwrap().dropped, 0);
        spool.take_batch(10).unwrap(); // 2
        spool.append(profile(4_000)).unwrap(); // drops 2, being sent
        spool.send_failed();
        assert_eq!(spool.state.lock().unwrap().dropped, 1, "the failed send lost it");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sequences_survive_restart_and_full_spools_drop_the_oldest() {
        let dir = std::env::temp_dir().join(format!("ember-spool-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let spool = Spool::open(&dir, "test", 10_000, usize::MAX).unwrap();
        assert_eq!(spool.append(profile(100)).unwrap(), 1);
        assert_eq!(spool.append(profile(100)).unwrap(), 2);
        assert_eq!(spool.remove(&[1, 2, 9]).unwrap(), 2);
        // Reopened empty: numbering goes on, so the collector cannot mistake new for old.
        let spool = Spool::open(&dir, "test", 10_000, usize::MAX).unwrap();
        assert_eq!(spool.append(profile(4_000)).unwrap(), 3);
        assert_eq!(spool.append(profile(4_000)).unwrap(), 4);
        assert_eq!(spool.append(profile(4_000)).unwrap(), 5);
        let left: Vec<u64> = spool.oldest(10).unwrap().iter().map(|p| p.sequence).collect();
        assert_eq!(left, [4, 5], "the oldest is dropped when the spool is over 10 kB");
        assert_eq!(spool.state.lock().unwrap().dropped, 1);
        // Pull mode keeps the newest N.
        let spool = Spool::open(&dir, "test", u64::MAX, 2).unwrap();
        spool.append(profile(10)).unwrap();
        let left: Vec<u64> = spool.after(4, 10).unwrap().iter().map(|p| p.sequence).collect();
        assert_eq!(left, [5, 6]);
        // Its id stays with the directory; a wiped spool gets a new one.
        let id = spool.id();
        assert_eq!(Spool::open(&dir, "test", u64::MAX, 2).unwrap().id(), id);
        fs::remove_dir_all(&dir).unwrap();
        assert_ne!(Spool::open(&dir, "test", u64::MAX, 2).unwrap().id(), id);
        fs::remove_dir_all(&dir).unwrap();
    }
}
