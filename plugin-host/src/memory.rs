//! Host memory standing in for device memory: zeroed, 64-byte-aligned regions whose addresses
//! are their "device" addresses, and the table of them that bounds what a copy may touch.

use std::sync::{Arc, Mutex, Weak};

use rpc_core::plugin::SharedRegion;
use rpc_core::sync::lock;

/// A zeroed, 64-byte-aligned allocation, only ever accessed through atomics once shared.
pub struct RawMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is plain bytes; every shared access to it is atomic.
unsafe impl Send for RawMemory {}
// SAFETY: as above.
unsafe impl Sync for RawMemory {}

impl RawMemory {
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1), 64).expect("a valid size")
    }

    pub fn zeroed(len: usize) -> Arc<Self> {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(Self::layout(len));
        }
        Arc::new(RawMemory { ptr, len })
    }

    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The byte at `offset` as an atomic.
    fn byte(&self, offset: usize) -> &std::sync::atomic::AtomicU8 {
        assert!(offset < self.len, "offset inside the region");
        // SAFETY: in bounds (checked above), alive while `self` is, and AtomicU8 has the size
        // and validity of u8.
        unsafe { &*(self.ptr.add(offset) as *const std::sync::atomic::AtomicU8) }
    }

    /// Copies `bytes` in at `offset` (atomically per byte: kernels may be reading).
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        for (k, &b) in bytes.iter().enumerate() {
            self.byte(offset + k)
                .store(b, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Copies out from `offset`.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        for (k, b) in out.iter_mut().enumerate() {
            *b = self
                .byte(offset + k)
                .load(std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The `u64` word at `offset`, as an atomic.
    pub fn u64_word(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(
            offset % 8 == 0 && offset + 8 <= self.len,
            "word inside the region"
        );
        // SAFETY: in bounds and 8-aligned (64-aligned base, offset checked), alive with `self`,
        // and AtomicU64 has the size and validity of u64.
        unsafe { &*(self.ptr.add(offset) as *const std::sync::atomic::AtomicU64) }
    }

    /// The `u32` words from `offset` on, as atomics.
    pub fn u32_words(&self, offset: usize, count: usize) -> &[std::sync::atomic::AtomicU32] {
        assert!(
            offset % 4 == 0 && offset + 4 * count <= self.len,
            "words inside the region"
        );
        // SAFETY: in bounds and 4-aligned (64-aligned base, offset checked), alive with `self`,
        // and AtomicU32 has the size and validity of u32.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset).cast(), count) }
    }
}

impl Drop for RawMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout; freed once.
        unsafe { std::alloc::dealloc(self.ptr, Self::layout(self.len)) }
    }
}

/// A mailbox region handed to the server; kernels keep the memory alive through their own `Arc`.
pub struct HostShared(pub Arc<RawMemory>);

// SAFETY: the `RawMemory` is a 64-byte-aligned heap allocation of `len` bytes that lives as
// long as its `Arc`, which this value holds; plugin-host's kernels reach a mailbox only through
// `Client`s over `Mailbox::from_raw`, the same atomic views of the same sizes as the server's.
unsafe impl SharedRegion for HostShared {
    fn host_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn device_addr(&self) -> u64 {
        self.0.addr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// The regions of one device, so a copy or a kernel's view can be checked against them.
#[derive(Default)]
pub struct MemoryMap {
    regions: Mutex<Vec<Weak<RawMemory>>>,
}

impl MemoryMap {
    pub fn insert(&self, memory: &Arc<RawMemory>) {
        let mut regions = lock(&self.regions);
        regions.retain(|r| r.strong_count() > 0);
        regions.push(Arc::downgrade(memory));
    }

    /// The live region holding `addr..addr + len`, and the offset of `addr` in it.
    pub fn find(&self, addr: u64, len: usize) -> Option<(Arc<RawMemory>, usize)> {
        let regions = lock(&self.regions);
        regions.iter().filter_map(Weak::upgrade).find_map(|r| {
            let offset = addr.checked_sub(r.addr())? as usize;
            (offset.checked_add(len)? <= r.len()).then_some((r.clone(), offset))
        })
    }
}

/// The "interrupt" of a host doorbell: a condition variable the client notifies.
#[derive(Default)]
pub struct Signal {
    lock: Mutex<()>,
    rung: std::sync::Condvar,
}

impl Signal {
    /// Raises the interrupt. Taking the lock orders it after the waiter's check of the counter.
    pub fn raise(&self) {
        let _guard = lock(&self.lock);
        self.rung.notify_all();
    }
}

/// A v2 doorbell of a host mailbox (PROTOCOL section 9): the `value` counter and the `mailbox`
/// word live in device memory (a region of the device's map, so a kernel finds them by the
/// addresses in the record), the interrupt is a [`Signal`].
pub struct HostDoorbell {
    pub(crate) words: Arc<RawMemory>,
    pub(crate) signal: Arc<Signal>,
    pub(crate) event_id: u32,
}

impl rpc_core::plugin::Doorbell for HostDoorbell {
    fn record(&self) -> [u8; 64] {
        let mut record = [0u8; 64];
        record[..8].copy_from_slice(&self.words.addr().to_le_bytes());
        record[8..16].copy_from_slice(&(self.words.addr() + 8).to_le_bytes());
        record[16..20].copy_from_slice(&self.event_id.to_le_bytes());
        record
    }

    fn counter(&self) -> &std::sync::atomic::AtomicU64 {
        self.words.u64_word(0)
    }

    fn wait(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut guard = lock(&self.signal.lock);
        loop {
            // Relaxed: the counter only decides whether to keep sleeping.
            if self.counter().load(std::sync::atomic::Ordering::Relaxed) != 0 {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            guard = self
                .signal
                .rung
                .wait_timeout(guard, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
