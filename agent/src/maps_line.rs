//! Lines of /proc/<pid>/maps, parsed without copying: the agent's own (its memory, its code)
//! and the profiled processes' (their code, which they shape).
/// One line of /proc/<pid>/maps: "start-end perms offset dev inode   path".
#[derive(Debug, PartialEq, Eq)]
pub struct MapsLine<'l> {
    /// "start-end", as map_files names the mapping.
    pub range: &'l str,
    pub start: u64,
    pub end: u64,
    /// "r-xp": read, write, execute, private or shared.
    pub perms: &'l str,
    pub file_offset: u64,
    /// "major:minor" in hex.
    pub device: &'l str,
    pub inode: u64,
    /// The path, which may hold spaces; empty for anonymous memory.
    pub path: &'l str,
}

impl<'l> MapsLine<'l> {
    pub fn parse(line: &'l str) -> Option<MapsLine<'l>> {
        let mut rest = line;
        let mut field = || {
            let trimmed = rest.trim_start_matches(' ');
            let (field, after) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
            rest = after;
            Some(field).filter(|f| !f.is_empty())
        };
        let (range, perms, offset, device, inode) = (field()?, field()?, field()?, field()?, field()?);
        let (start, end) = range.split_once('-')?;
        let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
        if start > end {
            return None;
        }
        Some(MapsLine {
            range,
            start,
            end,
            perms,
            file_offset: u64::from_str_radix(offset, 16).ok()?,
            device,
            inode: inode.parse().ok()?,
            path: rest.trim_start_matches(' '),
        })
    }

    pub fn executable(&self) -> bool {
        self.perms.contains('x')
    }

    /// Whether the mapping covers `address`.
    pub fn covers(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }
}

#[cfg(test)]
mod tests {
    use super::MapsLine;

    #[test]
    fn parses_maps_lines_with_and_without_paths() {
        let line = MapsLine::parse("55d1c2a00000-55d1c2a21000 r-xp 00002000 fd:01 1234567                    /usr/bin/my  app").unwrap();
        assert_eq!(
            line,
            MapsLine {
                range: "55d1c2a00000-55d1c2a21000",
                start: 0x55d1c2a00000,
                end: 0x55d1c2a21000,
                perms: "r-xp",
                file_offset: 0x2000,
                device: "fd:01",
                inode: 1234567,
                path: "/usr/bin/my  app",
            }
        );
        let anonymous = MapsLine::parse("7f0000000000-7f0000001000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((anonymous.executable(), anonymous.inode, anonymous.path), (false, 0, ""));
        assert!(line.covers(0x55d1c2a00000) && line.covers(0x55d1c2a20fff) && !line.covers(0x55d1c2a21000));
        assert_eq!(MapsLine::parse("7f0000001000-7f0000000000 r-xp 00000000 00:00 0"), None, "end before start");
        assert_eq!(MapsLine::parse("7f0000000000-7f0000001000 r-xp"), None);
        assert_eq!(MapsLine::parse(""), None);
    }
}
