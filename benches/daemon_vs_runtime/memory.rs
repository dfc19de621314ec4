//! Memory: the daemon's resident set from `/proc`, and the backoff store's heap counted exactly
//! by an allocator that keeps a running total.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use cri_imaged::{
    backoff::{BackoffConfig, BackoffStore},
    pull::PullError,
    runtime::RuntimeError,
};
use tokio::time::Instant;

/// Resident memory of a process, in KiB.
#[derive(Debug, Clone, Copy)]
pub struct Resident {
    /// `VmRSS`: resident now.
    pub now_kib: u64,
    /// `VmHWM`: the most resident since start or since [`reset_peak`].
    pub peak_kib: u64,
}

/// Reads `VmRSS` and `VmHWM` of `pid`.
pub fn resident(pid: u32) -> Resident {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("/proc/{pid}/status has no {name}"))
    };
    Resident { now_kib: field("VmRSS:"), peak_kib: field("VmHWM:") }
}

/// Restarts `VmHWM` from the current resident set (`clear_refs` value 5, Linux ≥ 4.0).
pub fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("write /proc/PID/clear_refs");
}

/// The system allocator, counting the bytes and allocations live at any moment.
pub struct CountingAllocator {
    bytes: AtomicUsize,
    allocations: AtomicUsize,
    /// Every allocation and reallocation ever made.
    made: AtomicUsize,
    /// The most bytes live at once since [`CountingAllocator::reset_peak`].
    peak: AtomicUsize,
}

impl CountingAllocator {
    pub const fn new() -> Self {
        Self {
            bytes: AtomicUsize::new(0),
            allocations: AtomicUsize::new(0),
            made: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// How many allocations (reallocations included) were made since start.
    pub fn allocations_made(&self) -> usize {
        self.made.load(Ordering::Relaxed)
    }

    /// (bytes, allocations) live now.
    pub fn live(&self) -> (usize, usize) {
        (self.bytes.load(Ordering::Relaxed), self.allocations.load(Ordering::Relaxed))
    }

    /// Restarts the peak from the bytes live now, and returns them.
    pub fn reset_peak(&self) -> usize {
        let now = self.bytes.load(Ordering::Relaxed);
        self.peak.store(now, Ordering::Relaxed);
        now
    }

    /// The most bytes live at once since [`CountingAllocator::reset_peak`] (every thread's).
    pub fn peak_bytes(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    fn grew(&self, by: usize) {
        let now = self.bytes.fetch_add(by, Ordering::Relaxed) + by;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            self.grew(layout.size());
            self.allocations.fetch_add(1, Ordering::Relaxed);
            self.made.fetch_add(1, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) };
        self.bytes.fetch_sub(layout.size(), Ordering::Relaxed);
        self.allocations.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            if new_size >= layout.size() {
                self.grew(new_size - layout.size());
            } else {
                self.bytes.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
            self.made.fetch_add(1, Ordering::Relaxed);
        }
        moved
    }
}

/// The backoff store's heap per entry, counted by the allocator.
#[derive(Debug, Clone, Copy)]
pub struct StoreCost {
    pub bytes_per_entry: f64,
    pub allocations_per_entry: f64,
}

/// Fills a backoff store as the daemon does (pod UIDs as the API server makes them, one image,
/// the error of one failed pull shared by all) and measures what it holds on the heap.
pub fn backoff_store_cost(allocator: &CountingAllocator, entries: usize, image: &str) -> StoreCost {
    let config = BackoffConfig { capacity: entries, ..BackoffConfig::KUBELET };
    let status = tonic::Status::not_found("failed to resolve reference: not found");
    let error = Arc::new(PullError::Runtime(RuntimeError::Status(status)));
    let now = Instant::now();
    let (bytes_before, allocations_before) = allocator.live();
    let mut store = BackoffStore::new(config);
    for index in 0..entries {
        let key = store.key(&pod_uid(index), image, "");
        store.record_failure(key, error.clone(), now);
    }
    let (bytes_after, allocations_after) = allocator.live();
    assert_eq!(store.len(), entries, "every key is kept");
    let per_entry = |before: usize, after: usize| after.saturating_sub(before) as f64 / entries as f64;
    StoreCost {
        bytes_per_entry: per_entry(bytes_before, bytes_after),
        allocations_per_entry: per_entry(allocations_before, allocations_after),
    }
}

/// A pod UID shaped like the API server's (a 36-character UUID), distinct for every `index`.
pub fn pod_uid(index: usize) -> String {
    format!("{:08x}-7a1c-4d2e-9f3b-{:012x}", index >> 16, index)
}
