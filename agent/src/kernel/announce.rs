//! New-process announcements: the exec program writes a process's tgid to a ring buffer when
//! the kernel first sees it (or after it execs), so that userspace captures its mappings while
//! it still runs. The resolve stage polls this.
use agent_common::{unmapped_region, ProcessEvent};
use anyhow::{Context as _, Result};
use aya::maps::{HashMap, MapData, RingBuf};
use tokio::io::unix::AsyncFd;

pub struct Announcements {
    ring: AsyncFd<RingBuf<MapData>>,
    /// The walker's record of the megabytes of unknown code it told of (`UNMAPPED_TOLD`).
    told: HashMap<MapData, u64, u64>,
}

impl Announcements {
    pub(super) fn new(ring: RingBuf<MapData>, told: HashMap<MapData, u64, u64>) -> Result<Announcements> {
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as
        // long as the AsyncFd owns the ring buffer.
        let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("registering the process ring buffer: {e}"))?;
        Ok(Announcements { ring, told })
    }

    /// Lets the walker tell again of unknown code in the megabyte of `pc` in process `tgid`
    /// this interval: what it told of was not code when the mappings were read (a wrong return
    /// address), and a library may yet be mapped there (the first dlopen maps where the
    /// loader's cache was).
    pub fn tell_again(&mut self, tgid: u32, pc: u64) {
        // Absent already (the LRU map dropped it): nothing to do.
        let _ = self.told.remove(&unmapped_region(tgid, pc));
    }

    /// Waits until the kernel has announced something.
    pub async fn readable(&mut self) -> Result<()> {
        let mut guard = self.ring.readable_mut().await.context("polling the process ring buffer")?;
        guard.clear_ready();
        Ok(())
    }

    /// What was announced since the last call, oldest first.
    pub fn take(&mut self) -> Vec<ProcessEvent> {
        let ring = self.ring.get_mut();
        let mut events = Vec::new();
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<ProcessEvent>() {
                // SAFETY: the kernel wrote a ProcessEvent (#[repr(C)], shared definition).
                events.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) });
            }
        }
        events
    }
}
