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

/// What a selection reads: complete roll-ups, and the sample rows of the profiles that start
/// in `raw` (ascending, disjoint), the rest of its range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub parts: Vec<Part>,
    pub raw: Vec<(u64, u64)>,
}

impl Read {
    /// The whole of [from, to) from the sample rows.
    pub fn raw(range: (u64, u64)) -> Read {
        Read { parts: Vec::new(), raw: vec![range] }
    }
}

/// What the buckets of a range hold now, and the builds of their roll-ups.
pub(super) struct Coverage {
    /// Profiles stored per bucket of the smallest level (each (origin, sequence) once).
    profiles: BTreeMap<u64, u64>,
    /// (level, bucket) -> (build, profiles the bucket held when it began).
    builds: HashMap<(u64, u64), Vec<(u64, u64)>>,
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

impl ClickHouse {
    /// The coverage of the buckets that start in [from, to); whole buckets only are counted
    /// right.
    pub(super) fn coverage(&self, (from, to): (u64, u64), deadline: Option<Instant>) -> Result<Coverage> {
        let db = &self.database;
        let counted = self.client.query(
            &format!(
                "SELECT intDiv(start_ns, {SMALLEST}) * {SMALLEST} AS bucket, uniqExact(origin, sequence) FROM {db}.profiles \
WHERE {} GROUP BY bucket FORMAT RowBinary",
                starts_in(from, to)
            ),
            &[],
            deadline,
        )?;
        let mut coverage = Coverage { profiles: BTreeMap::new(), builds: HashMap::new() };
        let mut r = Reader(&counted);
        while !r.is_empty() {
            coverage.profiles.insert(r.u64()?, r.u64()?);
        }
        let built = self.client.query(
            &format!("SELECT level, bucket, build, any(profiles) FROM {db}.builds WHERE bucket >= {from} AND bucket < {to} GROUP BY level, bucket, build FORMAT RowBinary"),
            &[],
            deadline,
        )?;
        let mut r = Reader(&built);
        while !r.is_empty() {
            let (level, bucket, build, held) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            coverage.builds.entry((level, bucket)).or_default().push((build, held));
        }
        Ok(coverage)
    }

    /// The largest complete roll-ups inside [from, to); the rest of it is read raw.
    pub(super) fn plan(&self, (from, to): (u64, u64), deadline: Option<Instant>) -> Result<Read> {
        let coverage = self.coverage((from, to), deadline)?;
        let segments = buckets::plan(from, to, &mut |level, from, to| {
            let mut complete: Vec<u64> = coverage.builds.keys().filter(|&&(l, b)| l == level && b >= from && b < to).map(|&(_, b)| b).collect();
            complete.retain(|&bucket| coverage.complete(level, bucket).is_some());
            complete.sort_unstable();
            Ok(complete)
        })?;
        let mut read = Read { parts: Vec::new(), raw: Vec::new() };
        for segment in segments {
            match segment {
                Segment::RollUps(level, bucket) => {
                    if let Some(build) = coverage.complete(level, bucket) {
                        read.parts.push(Part { level, bucket, build });
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
        };
        assert_eq!(coverage.complete(minute, 0), Some(8), "the smallest id of those that hold all six");
        assert_eq!(coverage.complete(minute, minute), None, "a profile arrived after the build began");
        assert_eq!(coverage.profiles(LEVELS[1], 0), 13);
        assert_eq!(coverage.complete(LEVELS[1], 0), Some(4));
        assert_eq!(coverage.complete(minute, 2 * minute), None);
    }
}
