//! Python frames. CPython is found in a process's files (`detect`, with each version's
//! offsets from `versions` or, where it publishes them, `debug_offsets`) and told to the
//! walk, which records each Python frame as its code object and position; here they are named
//! from the process's memory (`code`, `lines`, read with `process_memory`), and the evaluation loop's native
//! frames are told apart, where the interval puts each run's Python frames.
mod code;
mod debug_offsets;
mod detect;
mod lines;
mod versions;

use std::{
    collections::HashMap,
    sync::{Arc, Weak},
};

use agent_common::{python_frame, PythonProcess};

use super::{
    binary::Binary,
    untrusted::{read_with, Refused},
};
use crate::ops::metrics;
use code::{read_code, CodeInfo, CodeLayout};
use detect::{minor_from_name, Interpreter};
use super::process_memory::ProcessMemory;

/// A named Python frame.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PythonFrame {
    /// The function's qualified name (3.11+; its plain name before).
    pub name: Arc<str>,
    pub file: Arc<str>,
    /// 0 where the line is not known.
    pub line: u32,
}

/// Code objects read per process at most (a long-lived service runs a few thousand
/// functions); past it, the oldest interval's are dropped.
const MAX_CODES: usize = 65536;

/// CPython processes, and the interpreters found in files.
#[derive(Default)]
pub struct Pythons {
    /// By file (device, inode): the interpreter it holds, or None, while the file is open
    /// (a new file with the device and inode of a deleted one is examined again).
    interpreters: HashMap<(u64, u64), (Weak<Binary>, Option<Arc<Interpreter>>)>,
    processes: HashMap<u32, Process>,
    /// Counts `new_interval` calls: a code object read in an earlier interval is read again.
    interval: u64,
}

struct Process {
    interpreter: Arc<Interpreter>,
    /// The file the interpreter is in (device, inode): its native frames are matched by it.
    file: (u64, u64),
    /// Where the pointer to its first interpreter is (as the walk was told).
    interp_head: u64,
    memory: ProcessMemory,
    layout: CodeLayout,
    /// By code object address: what it was when last read, and in which interval.
    codes: HashMap<u64, (Option<Arc<CodeInfo>>, u64)>,
    /// Named frames by (code object, position), for the interval they were named in.
    frames: HashMap<(u64, i64), (Arc<PythonFrame>, u64)>,
}

impl Pythons {
    /// Looks for CPython in a process's mapped files (`files`: each file, where it is mapped
    /// and from which file offset), and returns what the walk needs, or None.
    pub fn capture(&mut self, tgid: u32, files: &[(Arc<Binary>, u64, u64)]) -> Option<PythonProcess> {
        let earlier = self.processes.remove(&tgid);
        for (binary, start, file_offset) in files {
            let Some(minor) = minor_from_name(binary.name()) else { continue };
            let interpreter = match self.interpreters.get(&binary.id) {
                Some((file, interpreter)) if std::ptr::eq(file.as_ptr(), Arc::as_ptr(binary)) => interpreter.clone(),
                _ => {
                    let interpreter = examine(binary, minor);
                    self.interpreters.insert(binary.id, (Arc::downgrade(binary), interpreter.clone()));
                    interpreter
                }
            };
            let Some(interpreter) = interpreter else { continue };
            let offsets = interpreter.offsets;
            let interp_head = interpreter.interp_head_in(*start, *file_offset)?;
            let eval = interpreter.eval_in(*start, *file_offset)?;
            // Read again (it mapped something new: a library, or glibc's unwinder as a thread
            // exits), the same interpreter keeps what was read of its code: once the process
            // has exited, that is all there is to name its last samples with.
            let same = earlier.filter(|p| p.file == binary.id && p.interp_head == interp_head);
            let process = same.unwrap_or_else(|| Process {
                interpreter,
                file: binary.id,
                interp_head,
                memory: ProcessMemory::new(tgid as i32),
                layout: offsets.code,
                codes: HashMap::new(),
                frames: HashMap::new(),
            });
            self.processes.insert(tgid, process);
            tracing::debug!(tgid, minor, path = binary.path, "CPython found");
            return Some(PythonProcess { interp_head, eval_start: eval.start, eval_end: eval.end, layout: offsets.walk });
        }
        None
    }

    /// Whether the walk was told of an interpreter in the process.
    pub fn runs_python(&self, tgid: u32) -> bool {
        self.processes.contains_key(&tgid)
    }

    /// Forgets a process; whether it ran an interpreter (the walk was told of).
    pub fn forget(&mut self, tgid: u32) -> bool {
        self.processes.remove(&tgid).is_some()
    }

    pub fn new_interval(&mut self) {
        self.interval += 1;
        // Files no process maps any more are closed: examined again if mapped again.
        self.interpreters.retain(|_, (file, _)| file.strong_count() > 0);
    }

    /// Whether a native frame of the process (its file and file offset) is in the evaluation
    /// loop, whose Python frames go in its place.
    pub fn evaluates(&self, tgid: u32, file: (u64, u64), file_offset: u64) -> bool {
        self.processes.get(&tgid).is_some_and(|p| p.file == file && p.interpreter.evaluates(file_offset))
    }

    /// Names a Python frame the walk recorded (`python_frame`) in process `tgid`. Returns it
    /// and whether it is the last of its run of the evaluation loop.
    pub fn frame(&mut self, tgid: u32, word: u64) -> (Arc<PythonFrame>, bool) {
        let (code, position, last_of_run) = python_frame::decode(word);
        let interval = self.interval;
        let Some(process) = self.processes.get_mut(&tgid) else {
            return (unnamed("[python: process not read]"), last_of_run);
        };
        if let Some((frame, named_in)) = process.frames.get(&(code, position)) {
            if *named_in == interval {
                return (frame.clone(), last_of_run);
            }
        }
        let info = process.code(code, interval);
        let frame = match info {
            Some(info) => Arc::new(PythonFrame {
                name: info.name.as_str().into(),
                file: info.filename.as_str().into(),
                line: info.line(position).unwrap_or(0),
            }),
            None => unnamed("[python: code object unreadable]"),
        };
        if process.frames.len() >= MAX_CODES {
            process.frames.retain(|_, (_, named_in)| *named_in == interval);
        }
        process.frames.insert((code, position), (frame.clone(), interval));
        (frame, last_of_run)
    }
}

impl Process {
    /// The code object at `address`, read once an interval: an object freed since and its
    /// memory reused by another is then not named as the old one. Where it can no longer be
    /// read as one (the process exited, or the object was freed after the samples: a module's
    /// code goes as its last call returns, just before a drain), the last reading stands: a
    /// frame holds its code object, so the samples that recorded it saw it alive.
    fn code(&mut self, address: u64, interval: u64) -> Option<Arc<CodeInfo>> {
        let earlier = match self.codes.get(&address) {
            Some((info, read_in)) if *read_in == interval => return info.clone(),
            Some((info, _)) => info.clone(),
            None => None,
        };
        let read = read_code(&self.memory, &self.layout, address, None);
        let info = match read {
            Ok(info) => Some(Arc::new(info)),
            Err(e) if earlier.is_some() => {
                tracing::debug!(address = format_args!("{address:#x}"), "code object not read again: {e}");
                earlier
            }
            Err(e) => {
                tracing::debug!(address = format_args!("{address:#x}"), "code object not named: {e}");
                if !e.gone() {
                    metrics::add("ember_python_code_unreadable_total", &[], 1.0);
                }
                None
            }
        };
        if self.codes.len() >= MAX_CODES {
            self.codes.retain(|_, (_, read_in)| *read_in == interval);
        }
        self.codes.insert(address, (info.clone(), interval));
        info
    }
}

/// Entry points for the fuzz targets: the parsers of what a Python process shapes.
#[cfg(fuzzing)]
pub mod fuzzing {
    pub use super::{
        debug_offsets::parse as debug_offsets,
        lines::{linetable_310_line, lnotab_line, location_table_line},
    };

    /// Whether a file holds a CPython 3.`minor` interpreter the walk can be told of.
    pub fn examine(file: &std::fs::File, minor: u8) -> bool {
        matches!(super::detect::Interpreter::examine(file, minor), Ok(Some(_)))
    }
}

fn unnamed(what: &str) -> Arc<PythonFrame> {
    Arc::new(PythonFrame { name: what.into(), file: "".into(), line: 0 })
}

/// The interpreter in a file named for CPython 3.`minor`, if it holds one Ember can walk
/// (anything else is reported once per file).
fn examine(binary: &Binary, minor: u8) -> Option<Arc<Interpreter>> {
    if !versions::KNOWN.contains(&minor) {
        tracing::warn!(path = binary.path, "CPython 3.{minor} is not a version Ember knows: its processes show native frames only");
        metrics::add("ember_python_unknown_versions_total", &[], 1.0);
        return None;
    }
    let examined = binary.file.try_clone().map_err(Refused::from).and_then(|file| read_with(binary.served, move || Interpreter::examine(&file, minor)));
    match examined {
        Ok(Ok(found)) => found.map(Arc::new),
        Err(refused) => {
            tracing::warn!(path = binary.path, "not read as CPython 3.{minor}: {}", refused.reason());
            metrics::add("ember_python_unknown_versions_total", &[], 1.0);
            None
        }
        Ok(Err(e)) => {
            tracing::warn!(path = binary.path, "not read as CPython 3.{minor}: {e:#}");
            metrics::add("ember_python_unknown_versions_total", &[], 1.0);
            None
        }
    }
}
