//! AQL kernel dispatch packets and kernel argument blocks, as plain bytes (testable without a GPU).
//!
//! The packet is `hsa_kernel_dispatch_packet_t` (hsa.h, 64 bytes):
//!
//! | offset | field |
//! |---|---|
//! | 0 | `header: u16` (type, barrier, acquire and release fence scopes) |
//! | 2 | `setup: u16` (bits 0..2: dimensions) |
//! | 4, 6, 8 | `workgroup_size_{x,y,z}: u16` |
//! | 12, 16, 20 | `grid_size_{x,y,z}: u32` (work-items, not work-groups) |
//! | 24 | `private_segment_size: u32` |
//! | 28 | `group_segment_size: u32` |
//! | 32 | `kernel_object: u64` |
//! | 40 | `kernarg_address: u64` |
//! | 56 | `completion_signal: u64` |
//!
//! # Memory ordering (publishing a packet)
//! The packet processor may read a slot at any time after the write index passes it; it treats
//! a slot whose header type is INVALID as not ready. So every field but the first 32 bits is
//! written with plain stores, then `header | setup << 16` with one **release** store, which
//! pairs with the packet processor's acquire of the header: it sees the whole body once it sees
//! the type. Only then is the queue's doorbell signal stored (a release store too).

use core::mem::{offset_of, size_of};

use rpc_core::plugin::Grid;
use static_assertions::const_assert_eq;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::AmdGpuError;

/// Bytes in one AQL packet (and one queue slot).
pub const PACKET_SIZE: usize = 64;

/// `HSA_PACKET_TYPE_INVALID` (`hsa_packet_type_t`): a slot that is not ready, which the packet
/// processor does not run.
pub const PACKET_TYPE_INVALID: u16 = 1;
/// `HSA_PACKET_TYPE_KERNEL_DISPATCH`: a kernel dispatch packet.
pub const PACKET_TYPE_KERNEL_DISPATCH: u16 = 2;
/// `HSA_PACKET_HEADER_TYPE` (`hsa_packet_header_t`): bit offset of the packet type (8 bits).
pub const HEADER_TYPE: u16 = 0;
/// `HSA_PACKET_HEADER_BARRIER`: bit offset of the barrier bit (the packet starts only when
/// the packets before it have completed).
pub const HEADER_BARRIER: u16 = 8;
/// `HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE`: bit offset of the acquire fence's scope (2 bits).
pub const HEADER_SCACQUIRE_FENCE_SCOPE: u16 = 9;
/// `HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE`: bit offset of the release fence's scope (2 bits).
pub const HEADER_SCRELEASE_FENCE_SCOPE: u16 = 11;
/// `HSA_FENCE_SCOPE_NONE` (`hsa_fence_scope_t`): no fence.
pub const FENCE_SCOPE_NONE: u16 = 0;
/// `HSA_FENCE_SCOPE_AGENT`: a fence that orders memory for the agent (the GPU) only.
pub const FENCE_SCOPE_AGENT: u16 = 1;
/// `HSA_FENCE_SCOPE_SYSTEM`: a fence that orders memory for every agent, the host included.
pub const FENCE_SCOPE_SYSTEM: u16 = 2;
/// `HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS` (`hsa_kernel_dispatch_packet_setup_t`): bit
/// offset of the grid's number of dimensions (1 to 3) in `setup`.
pub const SETUP_DIMENSIONS: u16 = 0;

/// `hsa_kernel_dispatch_packet_t`.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelDispatchPacket {
    /// Packet type, barrier bit and fence scopes (see [`header`]); written last, with release.
    pub header: u16,
    /// The grid's number of dimensions, at [`SETUP_DIMENSIONS`].
    pub setup: u16,
    /// `workgroup_size_{x,y,z}`: work-items per work-group (a CUDA block) in each dimension.
    pub workgroup_size: [u16; 3],
    /// `reserved0`: must be 0.
    pub reserved0: u16,
    /// `grid_size_{x,y,z}`: work-items (not work-groups) in each dimension.
    pub grid_size: [u32; 3],
    /// Scratch (private memory) bytes per work-item.
    pub private_segment_size: u32,
    /// Group memory (LDS) bytes per work-group.
    pub group_segment_size: u32,
    /// The kernel's code descriptor, `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT`.
    pub kernel_object: u64,
    /// The kernarg block's address, in memory of a kernarg pool.
    pub kernarg_address: u64,
    /// `reserved2`: must be 0.
    pub reserved2: u64,
    /// The `hsa_signal_t` handle the packet processor decrements when the kernel completes
    /// (0: none).
    pub completion_signal: u64,
}
const_assert_eq!(size_of::<KernelDispatchPacket>(), PACKET_SIZE);
const_assert_eq!(offset_of!(KernelDispatchPacket, setup), 2);
const_assert_eq!(offset_of!(KernelDispatchPacket, workgroup_size), 4);
const_assert_eq!(offset_of!(KernelDispatchPacket, grid_size), 12);
const_assert_eq!(offset_of!(KernelDispatchPacket, private_segment_size), 24);
const_assert_eq!(offset_of!(KernelDispatchPacket, group_segment_size), 28);
const_assert_eq!(offset_of!(KernelDispatchPacket, kernel_object), 32);
const_assert_eq!(offset_of!(KernelDispatchPacket, kernarg_address), 40);
const_assert_eq!(offset_of!(KernelDispatchPacket, completion_signal), 56);

/// A packet header: `packet_type`, the barrier bit, and the acquire/release fence scopes.
pub const fn header(packet_type: u16, barrier: bool, acquire: u16, release: u16) -> u16 {
    (packet_type << HEADER_TYPE)
        | ((barrier as u16) << HEADER_BARRIER)
        | (acquire << HEADER_SCACQUIRE_FENCE_SCOPE)
        | (release << HEADER_SCRELEASE_FENCE_SCOPE)
}

/// The header of every dispatch this plugin writes: KERNEL_DISPATCH; the barrier bit, so a
/// queue runs its kernels one after another (like a CUDA stream, and what lets one waiter
/// thread retire completions in order); system-scope acquire and release, so the kernel sees
/// host writes made before the launch and the host sees the kernel's writes once its completion
/// signal drops.
pub const DISPATCH_HEADER: u16 = header(
    PACKET_TYPE_KERNEL_DISPATCH,
    true,
    FENCE_SCOPE_SYSTEM,
    FENCE_SCOPE_SYSTEM,
);

/// What the packet needs from the kernel's symbol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelInfo {
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT`: the code descriptor the packet names.
    pub kernel_object: u64,
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE`: the kernarg block's bytes,
    /// explicit and implicit arguments.
    pub kernarg_segment_size: u32,
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT`, in bytes.
    pub kernarg_segment_align: u32,
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE`: the kernel's static LDS bytes.
    pub group_segment_size: u32,
    /// Scratch bytes per work-item: the kernel's fixed size, raised to
    /// [`DYNAMIC_STACK_SIZE`] when its call stack is dynamic (see [`private_segment_size`]).
    pub private_segment_size: u32,
}

/// The scratch a kernel with a dynamic call stack gets at least (LLVM's loader: 16 KiB).
pub const DYNAMIC_STACK_SIZE: u32 = 16 * 1024;

/// The private segment size to dispatch with: the kernel's fixed size, at least
/// [`DYNAMIC_STACK_SIZE`] when `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_DYNAMIC_CALLSTACK` is set
/// (recursion or indirect calls: the compiler cannot bound the stack).
pub fn private_segment_size(fixed: u32, dynamic_callstack: bool) -> u32 {
    if dynamic_callstack {
        fixed.max(DYNAMIC_STACK_SIZE)
    } else {
        fixed
    }
}

/// How many dimensions a launch uses: the highest with more than one block or thread.
pub fn dimensions(grid: &Grid) -> u16 {
    (0..3)
        .rev()
        .find(|&d| grid.blocks[d] > 1 || grid.threads[d] > 1)
        .map_or(1, |d| d as u16 + 1)
}

impl KernelDispatchPacket {
    /// The packet launching `kernel` over `grid`. AQL counts the grid in work-items, so each
    /// dimension is blocks x threads and must fit a `u32`; a work-group dimension must fit a `u16`.
    pub fn new(
        kernel: &KernelInfo,
        grid: &Grid,
        kernarg_address: u64,
        completion_signal: u64,
    ) -> Result<Self, AmdGpuError> {
        let mut workgroup_size = [0u16; 3];
        let mut grid_size = [0u32; 3];
        for d in 0..3 {
            if grid.blocks[d] == 0 || grid.threads[d] == 0 {
                return Err(AmdGpuError::BadGrid("a dimension is zero"));
            }
            workgroup_size[d] = u16::try_from(grid.threads[d])
                .map_err(|_| AmdGpuError::BadGrid("work-group over 65535"))?;
            grid_size[d] = grid.blocks[d]
                .checked_mul(grid.threads[d])
                .ok_or(AmdGpuError::BadGrid("grid over 2^32 - 1 work-items"))?;
        }
        Ok(KernelDispatchPacket {
            header: DISPATCH_HEADER,
            setup: dimensions(grid) << SETUP_DIMENSIONS,
            workgroup_size,
            reserved0: 0,
            grid_size,
            private_segment_size: kernel.private_segment_size,
            group_segment_size: kernel.group_segment_size,
            kernel_object: kernel.kernel_object,
            kernarg_address,
            reserved2: 0,
            completion_signal,
        })
    }

    /// The packet as the 64 little-endian bytes the packet processor reads.
    pub fn to_bytes(&self) -> [u8; PACKET_SIZE] {
        let mut out = [0u8; PACKET_SIZE];
        out[0..2].copy_from_slice(&self.header.to_le_bytes());
        out[2..4].copy_from_slice(&self.setup.to_le_bytes());
        for d in 0..3 {
            out[4 + 2 * d..6 + 2 * d].copy_from_slice(&self.workgroup_size[d].to_le_bytes());
            out[12 + 4 * d..16 + 4 * d].copy_from_slice(&self.grid_size[d].to_le_bytes());
        }
        out[24..28].copy_from_slice(&self.private_segment_size.to_le_bytes());
        out[28..32].copy_from_slice(&self.group_segment_size.to_le_bytes());
        out[32..40].copy_from_slice(&self.kernel_object.to_le_bytes());
        out[40..48].copy_from_slice(&self.kernarg_address.to_le_bytes());
        out[56..64].copy_from_slice(&self.completion_signal.to_le_bytes());
        out
    }

    /// Publishes the packet into a queue slot: bytes 4..64 first, then header and setup with
    /// one release store (see the module's "Memory ordering").
    ///
    /// # Safety
    /// - `slot` is a 64-byte, 64-byte-aligned AQL queue slot this thread reserved (its index
    ///   came from the queue's write index and the packet processor has consumed the previous
    ///   packet in it), valid for writes;
    /// - nothing else writes the slot until the packet processor has consumed it.
    pub unsafe fn publish(&self, slot: *mut u8) {
        let bytes = self.to_bytes();
        // SAFETY: `slot` is valid for 64 bytes of writes (caller, point 1); bytes 4..64 are not
        // read by the packet processor before the header changes from INVALID (hsa.h).
        unsafe {
            core::ptr::copy_nonoverlapping(bytes.as_ptr().add(4), slot.add(4), PACKET_SIZE - 4)
        };
        let first = u32::from(self.header) | (u32::from(self.setup) << 16);
        // SAFETY: `slot` is 64-byte aligned, so 4-byte aligned for an AtomicU32; the packet
        // processor accesses the word atomically too, and no one else writes it (point 2).
        let word = unsafe { AtomicU32::from_ptr(slot.cast::<u32>()) };
        // Release: pairs with the packet processor's acquire of the header, publishing bytes 4..64.
        word.store(first, Ordering::Release);
    }
}

/// Where the argument bytes go in the kernarg segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernargLayout {
    /// Bytes to allocate (at least the kernel's segment size, at least the given arguments),
    /// a multiple of 16.
    pub size: usize,
    /// Alignment of the allocation (at least 16, the minimum AQL requires).
    pub align: usize,
    /// Offset of the code-object-v5 implicit arguments, when the segment has room for them
    /// (see [`write_implicit_args`]).
    pub implicit: Option<usize>,
}

/// Bytes of the code object v5 implicit (hidden) argument block (AMDGPUUsage).
pub const IMPLICIT_ARGS_SIZE: usize = 256;

/// The layout for `explicit_len` bytes of packed arguments of a kernel whose kernarg segment
/// is `segment_size` bytes aligned to `segment_align`. The implicit arguments are the last 256
/// bytes of the segment (`segment_size - 256`), where LLVM's loader and offload plugin put
/// them: clang may align them past the explicit arguments' end, so only the segment's end is
/// certain. A segment with no room for them after the explicit arguments has none.
pub fn kernarg_layout(explicit_len: usize, segment_size: u32, segment_align: u32) -> KernargLayout {
    let segment = segment_size as usize;
    let implicit = segment
        .checked_sub(IMPLICIT_ARGS_SIZE)
        .filter(|&at| at >= explicit_len);
    KernargLayout {
        size: segment.max(explicit_len).max(16).next_multiple_of(16),
        align: (segment_align as usize).max(16).next_power_of_two(),
        implicit,
    }
}

/// Fills the fields of the v5 implicit arguments a kernel reads for its geometry (AMDGPUUsage,
/// "Code Object V5 Metadata"): `hidden_block_count_{x,y,z}: u32` at 0, 4, 8;
/// `hidden_group_size_{x,y,z}: u16` at 12, 14, 16; `hidden_remainder_{x,y,z}: u16` at 18, 20,
/// 22; `hidden_grid_dims: u16` at 64. Everything else stays zero (no printf buffer, hostcall
/// buffer, heap or queue pointer: RPC replaces the first two, and the rest are not provided).
pub fn write_implicit_args(grid: &Grid, out: &mut [u8]) {
    assert!(
        out.len() >= IMPLICIT_ARGS_SIZE,
        "implicit argument block too small"
    );
    for d in 0..3 {
        let groups = grid.blocks[d];
        let group_size = grid.threads[d] as u16;
        out[4 * d..4 * d + 4].copy_from_slice(&groups.to_le_bytes());
        out[12 + 2 * d..14 + 2 * d].copy_from_slice(&group_size.to_le_bytes());
        // Blocks here are whole, so no partial work-group: the remainder is 0.
        out[18 + 2 * d..20 + 2 * d].copy_from_slice(&0u16.to_le_bytes());
    }
    out[64..66].copy_from_slice(&dimensions(grid).to_le_bytes());
}

/// The whole kernarg block for `args` launched over `grid` with `layout`.
pub fn kernarg_bytes(args: &[u8], grid: &Grid, layout: &KernargLayout) -> Vec<u8> {
    let mut block = vec![0u8; layout.size];
    block[..args.len()].copy_from_slice(args);
    if let Some(at) = layout.implicit {
        write_implicit_args(grid, &mut block[at..at + IMPLICIT_ARGS_SIZE]);
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: KernelInfo = KernelInfo {
        kernel_object: 0x1122_3344_5566_7788,
        kernarg_segment_size: 272,
        kernarg_segment_align: 8,
        group_segment_size: 0x400,
        private_segment_size: 0x20,
    };

    #[test]
    fn dispatch_header_bits() {
        // type 2 in bits 0..8, barrier bit 8, acquire SYSTEM (2) at 9..11, release SYSTEM at 11..13.
        assert_eq!(DISPATCH_HEADER, 2 | 1 << 8 | 2 << 9 | 2 << 11);
        assert_eq!(DISPATCH_HEADER, 0x1502);
        assert_eq!(
            header(
                PACKET_TYPE_KERNEL_DISPATCH,
                false,
                FENCE_SCOPE_AGENT,
                FENCE_SCOPE_NONE
            ),
            0x0202
        );
        assert_eq!(
            header(
                PACKET_TYPE_INVALID,
                false,
                FENCE_SCOPE_NONE,
                FENCE_SCOPE_NONE
            ),
            1
        );
    }

    #[test]
    fn one_dimensional_packet_bytes() {
        let p = KernelDispatchPacket::new(&KERNEL, &Grid::linear(4, 64), 0xAAAA_0000, 0xBBBB_0000)
            .unwrap();
        let b = p.to_bytes();
        assert_eq!(&b[0..2], &0x1502u16.to_le_bytes());
        assert_eq!(&b[2..4], &1u16.to_le_bytes(), "setup: 1 dimension");
        assert_eq!(&b[4..10], &[64, 0, 1, 0, 1, 0], "work-group 64 x 1 x 1");
        assert_eq!(&b[10..12], &[0, 0]);
        assert_eq!(
            &b[12..24],
            &[0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0],
            "grid 256 x 1 x 1 work-items"
        );
        assert_eq!(&b[24..28], &0x20u32.to_le_bytes());
        assert_eq!(&b[28..32], &0x400u32.to_le_bytes());
        assert_eq!(&b[32..40], &KERNEL.kernel_object.to_le_bytes());
        assert_eq!(&b[40..48], &0xAAAA_0000u64.to_le_bytes());
        assert_eq!(&b[48..56], &[0; 8]);
        assert_eq!(&b[56..64], &0xBBBB_0000u64.to_le_bytes());
    }

    #[test]
    fn setup_counts_the_highest_used_dimension() {
        let g = |blocks, threads| Grid { blocks, threads };
        assert_eq!(dimensions(&g([1, 1, 1], [1, 1, 1])), 1);
        assert_eq!(dimensions(&g([8, 1, 1], [32, 1, 1])), 1);
        assert_eq!(dimensions(&g([8, 2, 1], [32, 1, 1])), 2);
        assert_eq!(dimensions(&g([1, 1, 1], [4, 4, 2])), 3);
        let p = KernelDispatchPacket::new(&KERNEL, &g([2, 3, 4], [8, 4, 2]), 0, 0).unwrap();
        assert_eq!(p.setup, 3);
        assert_eq!(p.workgroup_size, [8, 4, 2]);
        assert_eq!(p.grid_size, [16, 12, 8]);
    }

    #[test]
    fn out_of_range_grids_are_errors() {
        let g = |blocks, threads| Grid { blocks, threads };
        assert!(KernelDispatchPacket::new(&KERNEL, &g([1, 1, 1], [65536, 1, 1]), 0, 0).is_err());
        assert!(KernelDispatchPacket::new(&KERNEL, &g([1 << 31, 1, 1], [2, 1, 1]), 0, 0).is_err());
        assert!(KernelDispatchPacket::new(&KERNEL, &g([0, 1, 1], [1, 1, 1]), 0, 0).is_err());
    }

    #[test]
    fn publish_writes_the_header_word_last_and_whole() {
        #[repr(C, align(64))]
        struct Slot([u8; 64]);
        let mut slot = Slot([0xFF; 64]);
        slot.0[0..2].copy_from_slice(&PACKET_TYPE_INVALID.to_le_bytes());
        let p = KernelDispatchPacket::new(&KERNEL, &Grid::linear(1, 32), 0x10, 0x20).unwrap();
        // SAFETY: `slot` is a local, 64-byte aligned, 64 bytes long, written by no one else.
        unsafe { p.publish(slot.0.as_mut_ptr()) };
        assert_eq!(slot.0, p.to_bytes());
    }

    #[test]
    fn kernarg_layout_rounds_and_places_implicit_args() {
        // 12 bytes of explicit arguments, a v5 kernel: 16 + 256 = 272-byte segment.
        let l = kernarg_layout(12, 272, 8);
        assert_eq!(
            l,
            KernargLayout {
                size: 272,
                align: 16,
                implicit: Some(16)
            }
        );
        // Clang aligned the implicit block further (e.g. to 64): it is still the last 256.
        assert_eq!(kernarg_layout(12, 320, 8).implicit, Some(64));
        // Too small a segment for both: no implicit block.
        assert_eq!(kernarg_layout(24, 264, 8).implicit, None);
        // A kernel without implicit arguments (segment = explicit size).
        assert_eq!(
            kernarg_layout(12, 12, 4),
            KernargLayout {
                size: 16,
                align: 16,
                implicit: None
            }
        );
        // No arguments at all still gets a 16-byte block.
        assert_eq!(kernarg_layout(0, 0, 0).size, 16);
        // A larger segment alignment is kept.
        assert_eq!(kernarg_layout(8, 64, 64).align, 64);
        // More bytes given than the segment holds: the block grows to hold them.
        assert_eq!(kernarg_layout(40, 24, 8).size, 48);
    }

    #[test]
    fn implicit_args_carry_the_geometry() {
        let grid = Grid {
            blocks: [4, 2, 1],
            threads: [64, 1, 1],
        };
        let layout = kernarg_layout(12, 272, 8);
        let block = kernarg_bytes(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], &grid, &layout);
        assert_eq!(block.len(), 272);
        assert_eq!(&block[..12], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(&block[12..16], &[0; 4], "padding before the implicit block");
        let imp = &block[16..];
        assert_eq!(
            &imp[0..12],
            &[4, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0],
            "block counts"
        );
        assert_eq!(&imp[12..18], &[64, 0, 1, 0, 1, 0], "group sizes");
        assert_eq!(&imp[18..24], &[0; 6], "remainders");
        assert_eq!(&imp[64..66], &[2, 0], "grid dims");
    }

    #[test]
    fn a_dynamic_call_stack_gets_at_least_16_kib_of_scratch() {
        assert_eq!(private_segment_size(0x20, false), 0x20);
        assert_eq!(private_segment_size(0x20, true), 16 * 1024);
        assert_eq!(private_segment_size(64 * 1024, true), 64 * 1024);
    }
}
