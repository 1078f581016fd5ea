//! Time buckets of roll-ups: a roll-up merges, per agent and profile labels, the profiles that
//! start in one aligned bucket of a minute, ten minutes or an hour. A query over a range reads
//! the largest roll-ups that fit inside it and the raw profiles only at its ragged edges and
//! where nothing is rolled up yet, so an hour of 10 s profiles from ten hosts is ~20 records
//! to decode instead of 3600.
use anyhow::Result;

/// Bucket lengths in unix ns, smallest first. Each divides the next, so the embedded store
/// builds a bucket's roll-up from the roll-ups of the level below.
pub const LEVELS: [u64; 3] = [60 * SECOND, 600 * SECOND, 3600 * SECOND];

const SECOND: u64 = 1_000_000_000;

/// The start of the bucket of `level` that holds `time`.
pub fn bucket(level: u64, time: u64) -> u64 {
    time - time % level
}

/// What a query reads for a part of its range.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Segment {
    /// The raw profiles that start in [from, to).
    Profiles(u64, u64),
    /// The roll-ups of one bucket: (level, bucket start).
    RollUps(u64, u64),
}

/// Covers [from, to) with the largest roll-ups inside it, in time order; `rolled(level, from,
/// to)` lists the rolled-up buckets of `level` that start in [from, to), ascending.
pub fn plan(from: u64, to: u64, rolled: &mut impl FnMut(u64, u64, u64) -> Result<Vec<u64>>) -> Result<Vec<Segment>> {
    let mut segments = Vec::new();
    cover(from, to, LEVELS.len(), rolled, &mut segments)?;
    Ok(segments)
}

/// Covers [from, to) with the levels below `levels`.
fn cover(from: u64, to: u64, levels: usize, rolled: &mut impl FnMut(u64, u64, u64) -> Result<Vec<u64>>, out: &mut Vec<Segment>) -> Result<()> {
    if from >= to {
        return Ok(());
    }
    let Some(level) = levels.checked_sub(1).map(|i| LEVELS[i]) else {
        out.push(Segment::Profiles(from, to));
        return Ok(());
    };
    let mut at = from;
    for start in rolled(level, from, to)? {
        // Only whole buckets inside the range: a bucket that starts before `from` or ends
        // past `to` holds profiles the query must not see.
        if start < at || start.checked_add(level).is_none_or(|end| end > to) {
            continue;
        }
        cover(at, start, levels - 1, rolled, out)?;
        out.push(Segment::RollUps(level, start));
        at = start + level;
    }
    cover(at, to, levels - 1, rolled, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60 * SECOND;

    /// Everything rolled up, at every level, within [0, 2 h).
    fn all_rolled(level: u64, from: u64, to: u64) -> Result<Vec<u64>> {
        Ok((0..120 * MIN).step_by(level as usize).filter(|&b| b >= from && b < to).collect())
    }

    #[test]
    fn the_largest_buckets_inside_the_range_with_raw_profiles_at_the_edges() {
        // 00:00:30 .. 01:12:10: raw to 00:01, minutes to 00:10, ten minutes to 01:00, an
        // hour can't fit; then ten-minute and minute buckets, and raw for the last 10 s.
        let segments = plan(30 * SECOND, 72 * MIN + 10 * SECOND, &mut all_rolled).unwrap();
        let mut expected = vec![Segment::Profiles(30 * SECOND, MIN)];
        expected.extend((1..10).map(|m| Segment::RollUps(MIN, m * MIN)));
        expected.extend((1..7).map(|t| Segment::RollUps(10 * MIN, t * 10 * MIN)));
        expected.extend((70..72).map(|m| Segment::RollUps(MIN, m * MIN)));
        expected.push(Segment::Profiles(72 * MIN, 72 * MIN + 10 * SECOND));
        assert_eq!(segments, expected);
        assert_eq!(plan(0, 120 * MIN, &mut all_rolled).unwrap(), [Segment::RollUps(60 * MIN, 0), Segment::RollUps(60 * MIN, 60 * MIN)]);
    }

    #[test]
    fn buckets_not_rolled_up_are_read_raw_or_from_the_level_below() {
        // Only minute 3 and the ten minutes from 00:10 are rolled up.
        let mut rolled = |level: u64, from: u64, to: u64| -> Result<Vec<u64>> {
            let buckets: &[u64] = if level == MIN { &[3 * MIN, 12 * MIN] } else if level == 10 * MIN { &[10 * MIN] } else { &[] };
            Ok(buckets.iter().copied().filter(|&b| b >= from && b < to).collect())
        };
        assert_eq!(
            plan(0, 25 * MIN, &mut rolled).unwrap(),
            [
                Segment::Profiles(0, 3 * MIN),
                Segment::RollUps(MIN, 3 * MIN),
                Segment::Profiles(4 * MIN, 10 * MIN),
                Segment::RollUps(10 * MIN, 10 * MIN),
                Segment::Profiles(20 * MIN, 25 * MIN),
            ]
        );
        assert_eq!(plan(0, u64::MAX, &mut |_, _, _| Ok(Vec::new())).unwrap(), [Segment::Profiles(0, u64::MAX)]);
        assert_eq!(plan(5, 5, &mut all_rolled).unwrap(), []);
    }
}
