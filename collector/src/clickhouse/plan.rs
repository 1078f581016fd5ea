//! Which roll-ups a range reads. A build of a bucket's roll-ups records how many profiles the
//! bucket held when the build began (`rollups`); it holds all of them while the bucket holds
//! that many still: a profile that arrives later leaves it behind until a new build. A
//! query reads each bucket once, from one such complete build or raw, never both.
use std::{
    collections::{BTreeMap, HashMap},
    time::Instant,
};

use anyhow::Result;

use super::{row_binary::Reader, schema::starts_in, ClickHouse};
use crate::buckets::{self, Segment, LEVELS};

/// Profiles are counted per bucket of the smallest level; the larger ones add them up.
const SMALLEST: u64 = LEVELS[0];

/// A bucket's roll-ups, as one build made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub level: u64,
    pub bucket: u64,
    pub build: u64,
}

/// What roll-ups of one kind hold: the profiles of their groups (an agent's profiles of one
/// kind and labels with a sample), the first start and the last end among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub profiles: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}

impl Held {
    fn add(&mut self, other: Held) {
        self.profiles += other.profiles;
        self.first_ns = self.first_ns.min(other.first_ns);
        self.last_ns = self.last_ns.max(other.last_ns);
    }
}

/// What a selection reads: complete roll-ups, and the sample rows of the profiles that start
/// in `raw` (ascending, disjoint), the rest of its range; and what the roll-ups read hold,
/// per kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub parts: Vec<Part>,
    pub raw: Vec<(u64, u64)>,
    pub held: HashMap<String, Held>,
}

impl Read {
    /// The whole of [from, to) from the sample rows.
    pub fn raw(range: (u64, u64)) -> Read {
        Read { parts: Vec::new(), raw: vec![range], held: HashMap::new() }
    }
}

/// What the buckets of a range hold now, and the builds of their roll-ups.
pub(super) struct Coverage {
    /// Profiles stored per bucket of the smallest level (each (origin, sequence) once).
    profiles: BTreeMap<u64, u64>,
    /// (level, bucket) -> (build, profiles the bucket held when it began).
    builds: HashMap<(u64, u64), Vec<(u64, u64)>>,
    /// build -> what its roll-ups hold per kind.
    held: HashMap<u64, Vec<(String, Held)>>,
}

impl Coverage {
    /// Profiles stored in a bucket now.
    pub fn profiles(&self, level: u64, bucket: u64) -> u64 {
        self.profiles.range(bucket..bucket.saturating_add(level)).map(|(_, n)| n).sum()
    }

    /// The build of a bucket that holds every profile stored in it now (of several, the one
    /// with the smallest id, as every collector picks), if any.
    pub fn complete(&self, level: u64, bucket: u64) -> Option<u64> {
        let stored = self.profiles(level, bucket);
        let builds = self.builds.get(&(level, bucket))?;
        builds.iter().filter(|&&(_, held)| held == stored && held > 0).map(|&(build, _)| build).min()
    }
}

/// Counts each profile once, however many copies of it are stored.
const PROFILES: &str = "uniqExact(origin, sequence)";

impl ClickHouse {
    /// The coverage of the buckets that start in [from, to); whole buckets only are counted
    /// right.
    pub(super) fn coverage(&self, range: (u64, u64), deadline: Option<Instant>) -> Result<Coverage> {
        let profiles = self.per_minute(range, PROFILES, deadline)?;
        self.with_builds(range, profiles, deadline)
    }

    /// The coverage a read needs: the same, at a fraction of the cost where no profile is
    /// stored twice. A bucket holds at least as many profile rows as profiles, and at least
    /// as many profiles as a build of it held: rows as many as a build held prove that build
    /// complete. Only the other built buckets (a profile stored since, or a copy stored by a
    /// second collector) have their profiles counted.
    fn read_coverage(&self, range: (u64, u64), deadline: Option<Instant>) -> Result<Coverage> {
        let rows = self.per_minute(range, "count()", deadline)?;
        let mut coverage = self.with_builds(range, rows, deadline)?;
        let unsure: Vec<(u64, u64)> =
            coverage.builds.keys().filter(|&&(level, bucket)| coverage.complete(level, bucket).is_none()).map(|&(level, bucket)| (bucket, bucket + level)).collect();
        if let (Some(from), Some(to)) = (unsure.iter().map(|u| u.0).min(), unsure.iter().map(|u| u.1).max()) {
            let exact = self.per_minute((from, to), PROFILES, deadline)?;
            coverage.profiles.retain(|&minute, _| minute < from || minute >= to);
            coverage.profiles.extend(exact);
        }
        Ok(coverage)
    }

    /// Profiles per bucket of the smallest level among those that start in [from, to), as
    /// `count` (an aggregate of the profiles table) counts them.
    fn per_minute(&self, (from, to): (u64, u64), count: &str, deadline: Option<Instant>) -> Result<BTreeMap<u64, u64>> {
        let db = &self.database;
        let counted = self.client.query(
            &format!(
                "SELECT intDiv(start_ns, {SMALLEST}) * {SMALLEST} AS bucket, {count} FROM {db}.profiles WHERE {} GROUP BY bucket FORMAT RowBinary",
                starts_in(from, to)
            ),
            &[],
            deadline,
        )?;
        let mut profiles = BTreeMap::new();
        let mut r = Reader(&counted);
        while !r.is_empty() {
            profiles.insert(r.u64()?, r.u64()?);
        }
        Ok(profiles)
    }

    /// `profiles` (per bucket of the smallest level) and the builds of [from, to).
    fn with_builds(&self, (from, to): (u64, u64), profiles: BTreeMap<u64, u64>, deadline: Option<Instant>) -> Result<Coverage> {
        let db = &self.database;
        let mut coverage = Coverage { profiles, builds: HashMap::new(), held: HashMap::new() };
        // A build's rows (one per kind) are one insert: all of them are there, or none.
        let built = self.client.query(
            &format!(
                "SELECT level, bucket, build, profiles, kind, kind_profiles, first_ns, last_ns FROM {db}.builds \
WHERE bucket >= {from} AND bucket < {to} LIMIT 1 BY build, kind FORMAT RowBinary"
            ),
            &[],
            deadline,
        )?;
        let mut r = Reader(&built);
        while !r.is_empty() {
            let (level, bucket, build, stored) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let (kind, held) = (r.str()?, Held { profiles: r.u64()?, first_ns: r.u64()?, last_ns: r.u64()? });
            let builds = coverage.builds.entry((level, bucket)).or_default();
            if !builds.iter().any(|&(b, _)| b == build) {
                builds.push((build, stored));
            }
            if !kind.is_empty() {
                coverage.held.entry(build).or_default().push((kind, held));
            }
        }
        Ok(coverage)
    }

    /// The largest complete roll-ups inside [from, to); the rest of it is read raw.
    pub(super) fn plan(&self, (from, to): (u64, u64), deadline: Option<Instant>) -> Result<Read> {
        let coverage = self.read_coverage((from, to), deadline)?;
        let segments = buckets::plan(from, to, &mut |level, from, to| {
            let mut complete: Vec<u64> = coverage.builds.keys().filter(|&&(l, b)| l == level && b >= from && b < to).map(|&(_, b)| b).collect();
            complete.retain(|&bucket| coverage.complete(level, bucket).is_some());
            complete.sort_unstable();
            Ok(complete)
        })?;
        let mut read = Read { parts: Vec::new(), raw: Vec::new(), held: HashMap::new() };
        for segment in segments {
            match segment {
                Segment::RollUps(level, bucket) => {
                    if let Some(build) = coverage.complete(level, bucket) {
                        read.parts.push(Part { level, bucket, build });
                        for (kind, held) in coverage.held.get(&build).into_iter().flatten() {
                            read.held.entry(kind.clone()).and_modify(|sum| sum.add(*held)).or_insert(*held);
                        }
                    }
                }
                Segment::Profiles(start, end) => match read.raw.last_mut() {
                    Some(last) if last.1 == start => last.1 = end,
                    _ => read.raw.push((start, end)),
                },
            }
        }
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_is_complete_while_its_bucket_holds_what_it_held() {
        let minute = LEVELS[0];
        let coverage = Coverage {
            profiles: BTreeMap::from([(0, 6), (minute, 6), (9 * minute, 1)]),
            builds: HashMap::from([
                ((minute, 0), vec![(7, 5), (9, 6), (8, 6)]),
                ((minute, minute), vec![(3, 5)]),
                ((LEVELS[1], 0), vec![(4, 13)]),
            ]),
            held: HashMap::new(),
        };
        assert_eq!(coverage.complete(minute, 0), Some(8), "the smallest id of those that hold all six");
        assert_eq!(coverage.complete(minute, minute), None, "a profile arrived after the build began");
        assert_eq!(coverage.profiles(LEVELS[1], 0), 13);
        assert_eq!(coverage.complete(LEVELS[1], 0), Some(4));
        assert_eq!(coverage.complete(minute, 2 * minute), None);
    }
}
