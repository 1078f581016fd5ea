//! Kernel BTF, read just far enough to find struct member offsets (e.g. `sk_buff.sk`), so
//! the BPF side never hard-codes a kernel structure layout.
use std::collections::HashMap;

use anyhow::{bail, Context as _, Result};

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;
/// Deeper anonymous nesting, or a longer typedef chain, than any real BTF has: a cycle.
const MAX_NESTING: u32 = 32;
/// More members than one lookup in a real kernel's BTF looks at (sk_buff has ~100, nested).
const MAX_MEMBERS_SEARCHED: u32 = 10_000;

struct Type {
    name: u32,
    kind: u32,
    /// For modifiers and typedefs: the type they refer to.
    target: u32,
    kflag: bool,
    /// For structs and unions: (name, type, offset field) of each member.
    members: Vec<(u32, u32, u32)>,
}

pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
    structs: HashMap<String, u32>,
}

impl Btf {
    pub fn from_sys_fs() -> Result<Btf> {
        let data = std::fs::read("/sys/kernel/btf/vmlinux").context("reading kernel BTF /sys/kernel/btf/vmlinux")?;
        Btf::parse(&data)
    }

    pub fn parse(data: &[u8]) -> Result<Btf> {
        let u16_at = |at: usize| data.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let u32_at = |at: usize| data.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if u16_at(0) != Some(MAGIC) {
            bail!("not little-endian BTF");
        }
        let header = |at| u32_at(at).map(|v| v as usize).context("truncated BTF header");
        let (header_len, type_off, type_len, str_off, str_len) = (header(4)?, header(8)?, header(12)?, header(16)?, header(20)?);
        let strings = data.get(header_len + str_off..header_len + str_off + str_len).context("truncated BTF strings")?.to_vec();
        // Type ids start at 1; id 0 is void.
        let mut types = vec![Type { name: 0, kind: 0, target: 0, kflag: false, members: Vec::new() }];
        let (mut at, end) = (header_len + type_off, header_len + type_off + type_len);
        while at < end {
            let word = |i: usize| u32_at(at + 4 * i).context("truncated BTF type");
            let (name, info, target) = (word(0)?, word(1)?, word(2)?);
            let (kind, vlen, kflag) = ((info >> 24) & 0x1f, (info & 0xffff) as usize, info >> 31 == 1);
            at += 12;
            let mut members = Vec::new();
            let extra = match kind {
                1 | 14 | 17 => 4,              // int, var, decl_tag
                3 => 12,                       // array
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = at + 12 * i;
                        let field = |j: usize| u32_at(m + 4 * j).context("truncated BTF member");
                        members.push((field(0)?, field(1)?, field(2)?));
                    }
                    12 * vlen
                }
                6 | 13 => 8 * vlen,            // enum, func_proto
                15 | 19 => 12 * vlen,          // datasec, enum64
                _ => 0,
            };
            at += extra;
            types.push(Type { name, kind, target, kflag, members });
        }
        let mut btf = Btf { types, strings, structs: HashMap::new() };
        for (id, t) in btf.types.iter().enumerate() {
            if t.kind == KIND_STRUCT && t.name != 0 {
                btf.structs.entry(btf.name(t.name).to_string()).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    fn name(&self, offset: u32) -> &str {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or_default()
    }

    /// The named structs, for the fuzz target to look members up in.
    #[cfg(fuzzing)]
    pub fn struct_names(&self) -> impl Iterator<Item = &str> {
        self.structs.keys().map(String::as_str)
    }

    /// Byte offset of `member` in `struct name`, looking inside anonymous structs and unions.
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32> {
        let id = *self.structs.get(name).with_context(|| format!("kernel BTF has no struct {name}"))?;
        let mut budget = MAX_MEMBERS_SEARCHED;
        self.find_member(id, member, 0, &mut budget).with_context(|| format!("kernel BTF: struct {name} has no member {member}"))
    }

    /// `budget` bounds the members looked at: a hostile blob can nest anonymous members that
    /// share types so that the paths through them grow exponentially.
    fn find_member(&self, id: u32, member: &str, depth: u32, budget: &mut u32) -> Option<u32> {
        // Real structs nest anonymous members a few levels deep; a blob whose anonymous
        // members contain each other must end the search, not the stack.
        if depth > MAX_NESTING {
            return None;
        }
        let t = self.resolve(id)?;
        for &(name, type_id, offset) in &t.members {
            *budget = budget.checked_sub(1)?;
            // With kflag set, the low 24 bits are the bit offset (the high 8 a bitfield size).
            let bits = if t.kflag { offset & 0xff_ffff } else { offset };
            if name == 0 {
                if let Some(inner) = self.find_member(type_id, member, depth + 1, budget) {
                    return (bits / 8).checked_add(inner);
                }
            } else if self.name(name) == member {
                return Some(bits / 8);
            }
        }
        None
    }

    /// Follows typedefs and modifiers to a struct or union.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        // A chain longer than any real one is a cycle.
        for _ in 0..MAX_NESTING {
            let t = self.types.get(id as usize)?;
            match t.kind {
                KIND_STRUCT | KIND_UNION => return Some(t),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = t.target,
                _ => return None,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob whose struct contains itself twice, and whose typedefs name each other (found by
    /// the btf fuzz target: the first overflowed the stack, then took 2^32 steps).
    #[test]
    fn cycles_in_a_hostile_blob_end_the_lookup() {
        let words = |ws: &[u32]| ws.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        let strings = b"\0s\0t\0";
        let types = [
            // 1: struct s { <anonymous> s; <anonymous> s; <anonymous> t; }, size 8
            words(&[1, KIND_STRUCT << 24 | 3, 8, 0, 1, 0, 0, 1, 0, 0, 2, 0]),
            // 2: typedef t = 3; 3: typedef = 2
            words(&[3, KIND_TYPEDEF << 24, 3]),
            words(&[0, KIND_TYPEDEF << 24, 2]),
        ]
        .concat();
        let mut blob = vec![0x9f, 0xeb, 1, 0];
        blob.extend(words(&[24, 0, types.len() as u32, types.len() as u32, strings.len() as u32]));
        blob.extend(types);
        blob.extend(strings);
        let btf = Btf::parse(&blob).unwrap();
        assert!(btf.member_offset("s", "x").is_err());
    }

    #[test]
    fn finds_members_of_this_kernels_structs() {
        let btf = Btf::from_sys_fs().expect("kernel BTF");
        // sk_buff.sk sits in an anonymous union; sk_buff.len is a plain member after it.
        let sk = btf.member_offset("sk_buff", "sk").unwrap();
        let len = btf.member_offset("sk_buff", "len").unwrap();
        assert!(sk > 0 && sk < len && sk % 8 == 0, "sk at {sk}, len at {len}");
        assert!(btf.member_offset("sk_buff", "no_such_member").is_err());
    }
}
