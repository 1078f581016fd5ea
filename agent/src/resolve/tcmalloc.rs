//! gperftools tcmalloc's own sampled path (the full tcmalloc, `libtcmalloc.so.4`; not
//! tcmalloc-minimal, which has no sampler). With `TCMALLOC_SAMPLE_PARAMETER` set, tcmalloc
//! samples one allocation per that many bytes on average (a Poisson process, as Ember's own
//! sampling), gives each sampled one a span of its own and links it into a list of sampled
//! objects (`DLL_Prepend` onto the list's head, `DLL_Remove` when it is freed). The probes go
//! on the two calls that do that for sampled objects (`call` is emulated at a trap; neither
//! function has an instruction the kernel emulates before it returns, and both also move the
//! page heap's spans), or, where those calls are not found, on the functions: a trap per
//! sampled allocation and per free of one, not per call. The list's head is a hidden static:
//! its address is read from the code of the exported function that walks it
//! (`ReadStackTraces`), and checked in the process before it is trusted.
use std::{collections::HashMap, fs::File, os::unix::fs::FileExt as _};

use agent_common::tcmalloc_span;
use anyhow::{ensure, Context as _, Result};

use super::{
    call_sites::{calls_to, rip_relative, Call},
    process_memory::ProcessMemory,
};
use crate::kernel::{AllocProbe, AllocSite};

const DLL_PREPEND: &str = "_ZN8tcmalloc11DLL_PrependEPNS_4SpanES1_";
const DLL_REMOVE: &str = "_ZN8tcmalloc10DLL_RemoveEPNS_4SpanE";
const READ_STACK_TRACES: &str = "_ZN22TCMallocImplementation15ReadStackTracesEPi";
const SAMPLE_PARAMETER: &str = "_ZN61FLAG__namespace_do_not_use_directly_use_DECLARE_int64_instead31FLAGS_tcmalloc_sample_parameterE";
/// The symbols looked for among the allocator's.
pub const SYMBOLS: [&str; 4] = [DLL_PREPEND, DLL_REMOVE, READ_STACK_TRACES, SAMPLE_PARAMETER];
/// Bytes of `ReadStackTraces` searched for the head's address (it is loaded some 80 bytes in).
const READER_BYTES: usize = 256;
/// The head's `next` and `prev` pointers, after `start` and `length`.
const HEAD_LINKS: u64 = 0x10;

/// Where tcmalloc's sampled path is in its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampledPath {
    /// The probes on `DLL_Prepend` (its head not yet known) and `DLL_Remove`.
    grows: AllocSite,
    shrinks: AllocSite,
    /// Link-time addresses of the sampling period (an int64 flag) and of the list's head.
    period: u64,
    head: u64,
    /// A text address of the file and its file offset, to place the others in a process.
    anchor: (u64, u64),
}

/// tcmalloc's sampling in one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    /// Mean bytes between sampled allocations.
    pub period: u64,
    /// The two probes, the head's address in the process in the first one's.
    pub sites: [AllocSite; 2],
}

impl SampledPath {
    /// The sampled path of `elf` (read from `file`), whose symbols (by name, link-time
    /// address) include `symbols`, if it has one. `site` places a probe on a function, or an
    /// instruction, by its file offset.
    pub fn find<'data, R: object::ReadRef<'data>>(
        elf: &object::File<'data, R>,
        file: &File,
        symbols: &HashMap<&str, u64>,
        file_offset: impl Fn(u64) -> Option<u64>,
        site: impl Fn(&'static str, AllocProbe, u64) -> AllocSite,
    ) -> Option<SampledPath> {
        let [grows, shrinks, reader, period] = SYMBOLS.map(|name| symbols.get(name).copied());
        let (grows, shrinks, reader) = (grows?, shrinks?, reader?);
        let reader_offset = file_offset(reader)?;
        let mut code = [0u8; READER_BYTES];
        let read = file.read_at(&mut code, reader_offset).ok()?;
        let head = rip_relative_lea(&code[..read], reader)?;
        // The one call that prepends onto the head, and the one that removes a span marked sampled.
        let prepends_sampled = |call: &Call| loads_rdi_with(call, head);
        let removes_sampled = |call: &Call| tests_sampled_mark(&call.before);
        let probed = |function, probe, called: u64, is_sampled_path: &dyn Fn(&Call) -> bool| {
            let mut calls = calls_to(elf, function, called).into_iter().filter(|c| is_sampled_path(c));
            let at = match (calls.next(), calls.next()) {
                (Some(call), None) => call.address,
                _ => called,
            };
            Some(site(function, probe, file_offset(at)?))
        };
        Some(SampledPath {
            grows: probed(DLL_PREPEND, AllocProbe::SampledAllocation(0), grows, &prepends_sampled)?,
            shrinks: probed(DLL_REMOVE, AllocProbe::SampledFree, shrinks, &removes_sampled)?,
            period: period?,
            head,
            anchor: (reader, reader_offset),
        })
    }

    /// The file offset whose address in a process `in_process` takes.
    pub fn anchor_offset(&self) -> u64 {
        self.anchor.1
    }

    /// The sampling of process `pid`, whose mapping of the file puts the anchor's file offset
    /// at `anchor_at`: None when tcmalloc does not sample there (the period is 0, as by
    /// default), an error when the head is not a list's.
    pub fn in_process(&self, pid: u32, anchor_at: u64) -> Result<Option<Sampling>> {
        let memory = ProcessMemory::new(pid as i32);
        let at = |address: u64| anchor_at.wrapping_sub(self.anchor.0).wrapping_add(address);
        let mut word = [0u8; 8];
        memory.read(at(self.period), &mut word).context("reading tcmalloc's sampling period")?;
        let period = i64::from_le_bytes(word);
        if period <= 0 {
            return Ok(None);
        }
        let head = at(self.head);
        let mut links = [0u8; 16];
        memory.read(head + HEAD_LINKS, &mut links).context("reading tcmalloc's list of sampled objects")?;
        let (next, prev) = (u64::from_le_bytes(links[..8].try_into()?), u64::from_le_bytes(links[8..].try_into()?));
        ensure!(next != 0 && prev != 0 && next % 8 == 0 && prev % 8 == 0, "no list of sampled objects where tcmalloc's code says (links {next:#x}, {prev:#x})");
        let grows = AllocSite { probe: AllocProbe::SampledAllocation(head), ..self.grows };
        Ok(Some(Sampling { period: period as u64, sites: [grows, self.shrinks] }))
    }
}

/// The target of the first `lea disp32(%rip), reg` (64-bit) in `code`, the bytes of a function
/// at link-time address `address`.
fn rip_relative_lea(code: &[u8], address: u64) -> Option<u64> {
    code.windows(7).enumerate().find_map(|(at, bytes)| {
        let is_lea = matches!(bytes[0], 0x48 | 0x4c) && bytes[1] == 0x8d && bytes[2] & 0xc7 == 0x05;
        is_lea.then(|| rip_relative(address, at, &bytes[3..7], 7))
    })
}

/// Whether `lea head(%rip), %rdi` is among the bytes before `call`.
fn loads_rdi_with(call: &Call, head: u64) -> bool {
    let start = call.address - call.before.len() as u64;
    call.before.windows(7).enumerate().any(|(at, bytes)| bytes[..3] == [0x48, 0x8d, 0x3d] && rip_relative(start, at, &bytes[3..7], 7) == head)
}

/// Whether `testb $SAMPLED, FLAGS(reg)` (a span's sampled mark) is among `bytes`: f6 /0 with
/// an 8-bit displacement, through a SIB byte where the base is rsp or r12.
fn tests_sampled_mark(bytes: &[u8]) -> bool {
    let (flags, sampled) = (tcmalloc_span::FLAGS as u8, tcmalloc_span::SAMPLED);
    let plain = bytes.windows(4).any(|b| b[0] == 0xf6 && b[1] & 0xf8 == 0x40 && b[1] != 0x44 && b[2..] == [flags, sampled]);
    plain || bytes.windows(5).any(|b| b[..2] == [0xf6, 0x44] && b[3..] == [flags, sampled])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debians_tcmalloc_is_probed_on_the_two_calls_of_its_sampled_path() {
        let path = format!("/usr/lib/{}-linux-gnu/libtcmalloc.so.4", std::env::consts::ARCH);
        let file = File::open(&path).expect("setup installs libgoogle-perftools4");
        let functions = crate::resolve::allocator::functions_in(&file).expect("tcmalloc defines malloc");
        let path = functions.sampled_path.expect("the full tcmalloc has a sampled path");
        for site in [path.grows, path.shrinks] {
            let mut opcode = [0u8];
            file.read_at(&mut opcode, site.offset).unwrap();
            assert_eq!((opcode[0], site.stepped), (0xe8, false), "{site:?}: a call, not the function's entry");
        }
        assert_ne!(path.grows.offset, path.shrinks.offset);
    }

    #[test]
    fn a_library_shaped_like_tcmalloc_is_probed_on_its_calls_and_on_its_functions_where_they_are_not_found() {
        // fuzz/seeds/tcmalloc-sampled-path.c: malloc's `call DLL_Prepend@plt` at 0x1087 after
        // `lea head(%rip),%rdi` (head at 0x40e0), free's `call DLL_Remove@plt` at 0x109b.
        let seed = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/elf_file/tcmalloc-sampled-path");
        let mut bytes = std::fs::read(seed).unwrap();
        let sites = |bytes: &[u8]| {
            let file = super::super::vdso::memory_file(c"seed", bytes).unwrap();
            let path = crate::resolve::allocator::functions_in(&file).and_then(|f| f.sampled_path).expect("a sampled path");
            (path.head, path.grows.offset, path.shrinks.offset)
        };
        assert_eq!(sites(&bytes), (0x40e0, 0x1087, 0x109b));
        // Without the sampled mark's test before it, the free's call is not trusted: the probe
        // goes on DLL_Remove itself (at 0x103d).
        bytes[0x1091..0x1095].copy_from_slice(&[0x90; 4]);
        assert_eq!(sites(&bytes), (0x40e0, 0x1087, 0x103d));
    }

    #[test]
    fn a_sampled_mark_test_is_recognised_through_any_base_register() {
        // testb $0x4,0x2b(%rbp); testb $0x4,0x2b(%r12) (41 f6 44 24 2b 04); the same with another bit.
        assert!(tests_sampled_mark(&[0x90, 0xf6, 0x45, 0x2b, 0x04, 0x74, 0x2c]));
        assert!(tests_sampled_mark(&[0x41, 0xf6, 0x44, 0x24, 0x2b, 0x04]));
        assert!(!tests_sampled_mark(&[0xf6, 0x45, 0x2b, 0x08]));
        assert!(!tests_sampled_mark(&[0xf6, 0x44, 0x2b, 0x04]));
    }

    #[test]
    fn the_heads_address_is_the_target_of_the_first_rip_relative_lea() {
        // Debian's libtcmalloc.so.4 2.10, ReadStackTraces at 0x1a180: lea 0x10(%rsp),%rbp
        // (not rip-relative) at +0x1d, then lea 0x1ba609(%rip),%r12 at +0x50.
        let mut code = vec![0x90; 0x50];
        code[0x1d..0x22].copy_from_slice(&[0x48, 0x8d, 0x6c, 0x24, 0x10]);
        code.extend([0x4c, 0x8d, 0x25, 0x09, 0xa6, 0x1b, 0x00]);
        assert_eq!(rip_relative_lea(&code, 0x1a180), Some(0x1d47e0));
        assert_eq!(rip_relative_lea(&code[..0x50], 0x1a180), None);
    }
}
