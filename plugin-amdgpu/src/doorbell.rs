//! The v2 mailbox doorbell (PROTOCOL section 9) as an HSA interrupt signal.
//!
//! The v2 record at the start of the mailbox is `value: *u64` at 0, `mailbox: *u64` at 8,
//! `event_id: u32` at 16 (64 bytes, the rest zero). A client that opens a port does
//! `fetch_add(*value, 1)`; on 0 -> 1 it stores `event_id` into `*mailbox` and raises an
//! interrupt (`s_sendmsg`). The server does `fetch_sub(*value, 1)` once per served port.
//!
//! # Why the signal's own words
//! That is exactly how a device signals an AMD interrupt signal (`amd_hsa_signal.h`): atomic
//! on `amd_signal_t::value`, then `event_id` into `*event_mailbox_ptr`, then `s_sendmsg`. The
//! kernel driver wakes a host waiter only for an event whose slot in *its* event page was
//! written, so `mailbox` must be the signal's `event_mailbox_ptr` (a word we allocated
//! ourselves would never wake anyone), and a host blocked in `hsa_signal_wait_scacquire`
//! re-checks the signal's `value` after waking and sleeps again if it did not change, so the
//! counter must be the signal's `value`. Hence `value = &amd_signal.value`,
//! `mailbox = amd_signal.event_mailbox_ptr`, `event_id = amd_signal.event_id`; the runtime
//! allocates `amd_signal_t` in fine-grained system memory every agent can access. The host
//! then sleeps with `wait(NE 0, timeout)` and wakes on the first request.
//!
//! # Memory ordering
//! The counter is only a wake-up hint. The server's `fetch_sub` may be `Relaxed`: the port's
//! own words carry the data ordering (rpc-core). `hsa_signal_wait_scacquire` returns with
//! acquire semantics, so a server that wakes on the counter sees the port word the client
//! wrote before its `fetch_add` (the client releases before incrementing). A lost interrupt
//! (ROCm's lost-doorbell problem) costs at most the wait's timeout: callers always pass one.

use core::time::Duration;
use std::sync::Arc;

use std::sync::atomic::AtomicU64;

use crate::error::AmdGpuError;
use crate::loader::{AmdSignal, HsaApi, Signal, AMD_SIGNAL_KIND_USER, SIGNAL_CONDITION_NE};

/// Bytes of the v2 doorbell record (the mailbox prefix).
pub const RECORD_SIZE: usize = 64;

/// The record bytes for a counter at `value`, an event mailbox at `mailbox` and `event_id`.
/// Both pointers or neither: `(0, 0, _)` is the "no doorbell, pure polling" record.
pub fn record_bytes(value: u64, mailbox: u64, event_id: u32) -> [u8; RECORD_SIZE] {
    debug_assert_eq!(
        value == 0,
        mailbox == 0,
        "set both doorbell pointers or neither"
    );
    let mut out = [0u8; RECORD_SIZE];
    out[0..8].copy_from_slice(&value.to_le_bytes());
    out[8..16].copy_from_slice(&mailbox.to_le_bytes());
    out[16..20].copy_from_slice(&event_id.to_le_bytes());
    out
}

/// An interrupt signal serving as one mailbox's doorbell.
pub struct AmdGpuDoorbell {
    hsa: Arc<dyn HsaApi>,
    signal: Signal,
    /// System timestamp ticks per second (the unit of `hsa_signal_wait_*` timeouts).
    ticks_per_second: u64,
}

// SAFETY: the signal is a runtime object usable from any thread; `&AmdGpuDoorbell` only reads it
// through the runtime's thread-safe functions and through atomics.
unsafe impl Send for AmdGpuDoorbell {}
// SAFETY: as above.
unsafe impl Sync for AmdGpuDoorbell {}

impl AmdGpuDoorbell {
    /// Creates the interrupt signal (value 0, no consumers given, so ROCr makes it an
    /// interrupt signal). [`AmdGpuError::NoInterrupts`] if the runtime gave a signal without an
    /// event mailbox: then use no doorbell (the zero record) and poll.
    pub fn new(hsa: Arc<dyn HsaApi>) -> Result<Self, AmdGpuError> {
        let ticks_per_second = hsa.timestamp_frequency()?;
        let signal = hsa.signal_create(0)?;
        let bell = AmdGpuDoorbell {
            hsa,
            signal,
            ticks_per_second: ticks_per_second.max(1),
        };
        let amd = bell.amd_signal();
        if amd.kind != AMD_SIGNAL_KIND_USER || amd.event_mailbox_ptr == 0 {
            return Err(AmdGpuError::NoInterrupts);
        }
        Ok(bell)
    }

    fn amd_signal(&self) -> &AmdSignal {
        // SAFETY: with ROCr an `hsa_signal_t` handle is the address of its `amd_signal_t`
        // (the ABI device code relies on to signal), 64-byte aligned, alive until
        // `hsa_signal_destroy` in our drop. Its non-`value` fields are written once at creation.
        unsafe { &*(self.signal.handle as *const AmdSignal) }
    }

    /// The 64-byte record to write at the start of a v2 mailbox.
    pub fn record(&self) -> [u8; RECORD_SIZE] {
        let amd = self.amd_signal();
        record_bytes(self.counter_addr(), amd.event_mailbox_ptr, amd.event_id)
    }

    fn counter_addr(&self) -> u64 {
        self.signal.handle + core::mem::offset_of!(AmdSignal, value) as u64
    }

    /// The counter of open requests, for the server's `fetch_sub` at each close.
    pub fn counter(&self) -> &AtomicU64 {
        // SAFETY: the address is `amd_signal_t::value`, an 8-byte-aligned i64 (same bits as a
        // u64) that device and runtime access only atomically; it lives as long as `self`.
        unsafe { AtomicU64::from_ptr(self.counter_addr() as *mut u64) }
    }

    /// Blocks until the counter is non-zero or `timeout` passes; returns the counter's value
    /// (0 on timeout). Always pass a timeout: an interrupt can be lost.
    pub fn wait(&self, timeout: Duration) -> u64 {
        let ticks = (timeout.as_nanos() * u128::from(self.ticks_per_second) / 1_000_000_000)
            .min(u128::from(u64::MAX)) as u64;
        // SAFETY: `signal` is live (destroyed only in drop).
        let value = unsafe {
            self.hsa
                .signal_wait_scacquire(self.signal, SIGNAL_CONDITION_NE, 0, ticks)
        };
        value as u64
    }
}

impl Drop for AmdGpuDoorbell {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once here; the glue removes the record from the
        // mailbox (detach) before dropping the doorbell.
        if let Err(e) = unsafe { self.hsa.signal_destroy(self.signal) } {
            log::warn!("amdgpu: {e}");
        }
    }
}

/// The generic glue's view: it writes `record` at the start of the mailbox, the server
/// decrements `counter` at each close, and the worker sleeps in `wait` while no request is open.
impl rpc_core::plugin::Doorbell for AmdGpuDoorbell {
    fn record(&self) -> [u8; 64] {
        AmdGpuDoorbell::record(self)
    }
    fn counter(&self) -> &AtomicU64 {
        AmdGpuDoorbell::counter(self)
    }
    fn wait(&self, timeout: Duration) -> bool {
        AmdGpuDoorbell::wait(self, timeout) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_bytes_follow_the_v2_layout() {
        let r = record_bytes(0x0000_7f12_3456_7808, 0x0000_7f00_dead_b000, 0x0102_0304);
        assert_eq!(r.len(), rpc_core::protocol::Generation::V2.prefix());
        assert_eq!(
            &r[0..8],
            &[0x08, 0x78, 0x56, 0x34, 0x12, 0x7f, 0, 0],
            "value pointer at 0, little-endian"
        );
        assert_eq!(
            &r[8..16],
            &[0x00, 0xb0, 0xad, 0xde, 0x00, 0x7f, 0, 0],
            "mailbox pointer at 8"
        );
        assert_eq!(&r[16..20], &[4, 3, 2, 1], "event id at 16");
        assert!(r[20..].iter().all(|&b| b == 0), "the rest is zero");
    }

    #[test]
    fn the_no_doorbell_record_is_all_zero() {
        assert_eq!(record_bytes(0, 0, 0), [0u8; 64]);
    }

    #[test]
    fn the_counter_is_the_value_word_of_the_signal() {
        // The record's value pointer is handle + 8 (amd_signal_t::value).
        assert_eq!(core::mem::offset_of!(AmdSignal, value), 8);
    }
}
