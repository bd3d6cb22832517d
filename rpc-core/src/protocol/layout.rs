//! Mailbox layouts of the three generations (PROTOCOL sections 1, 2 and 8).
//!
//! One contiguous, zero-initialised, 64-byte-aligned region. v1 and v2 (LLVM 19+):
//!
//! | part | offset | size |
//! |---|---|---|
//! | doorbell record (v2 only) | 0 | `D` = 64 (v2) or 0 (v1) |
//! | `primary[N]: u32` (server's words) | `D` | `4N` |
//! | `secondary[N]: u32` (client's words) | `D + 4N` | `4N` |
//! | `header[N]: Header` | `D + 8N` | `16N` |
//! | `packet[N][L]: Buffer` | `P = align_up(D + 24N, 8) = D + 24N` | `64LN` |
//!
//! The packets follow the headers at `Buffer`'s alignment (8), as LLVM lays them out, not at a
//! cache line: `P` is a multiple of 64 only when `N` is a multiple of 8.
//!
//! v0 (LLVM 18) keeps each port's header inside its packet, `alignas(64) { Header; Buffer[L] }`:
//!
//! | part | offset | size |
//! |---|---|---|
//! | `primary[N]: u32` | 0 | `4N` |
//! | `secondary[N]: u32` | `4N` | `4N` |
//! | `packet[N]: { Header, Buffer[L], padding }` | `H = align_up(8N, 64)` | `(64 + 64L) N` |
//!
//! Port `i`'s header is at `H + i (64 + 64L)` and its lane `k`'s buffer 16 + 64k bytes further;
//! [`Layout::header_of`] and [`Layout::packet_of`] give both for every generation.
//!
//! The device-side client object (written into `__llvm_rpc_client`, or where
//! `__llvm_libc_rpc_client` points) is `port_count: u32`, 4 bytes of padding, [v2: the doorbell
//! address], the addresses of `primary` (its inbox), `secondary` (its outbox), `header` (v1, v2
//! only), `packet` (v0: the packet array, `H`), then `MAX_PORT_COUNT / 32` zeroed `u32` lock
//! words.

use core::fmt;
use core::mem::{align_of, offset_of, size_of};
use core::str::FromStr;

use static_assertions::const_assert_eq;

use crate::protocol::error::ProtocolError;

/// One lane's packet: 8 little-endian `u64` words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct Buffer {
    /// The words, as the lane wrote them.
    pub data: [u64; 8],
}

/// A port's header: the client's lane mask and the opcode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Header {
    /// The lanes of the request, one bit each.
    pub mask: u64,
    /// The opcode.
    pub opcode: u32,
    /// Unused; keeps LLVM's 16-byte header.
    pub _padding: u32,
}

/// Bytes in one [`Buffer`].
pub const BUFFER_SIZE: usize = 64;
/// Bytes of a byte string carried by the first packet of `send_n` (after the length word).
pub const FIRST_PACKET_BYTES: usize = BUFFER_SIZE - 8;

const_assert_eq!(size_of::<Buffer>(), BUFFER_SIZE);
const_assert_eq!(align_of::<Buffer>(), 8);
const_assert_eq!(size_of::<Header>(), 16);
const_assert_eq!(offset_of!(Header, mask), 0);
const_assert_eq!(offset_of!(Header, opcode), 8);

/// The lane sizes a warp can have: a CPU client, NVPTX or AMDGPU wave32, AMDGPU wave64.
pub const LANE_SIZES: [u32; 3] = [1, 32, 64];

/// The three mailbox generations LLVM has shipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Generation {
    /// "header in the packet": LLVM 18 (`libc/src/__support/RPC/rpc.h`), 512 ports at most,
    /// each port's header inside its 64-byte-aligned packet.
    V0,
    /// "pre-doorbell": LLVM releases up to 22.
    V1,
    /// "doorbell": LLVM main after 2026-03-23 (PR #188067), releases 23+.
    V2,
}

impl Generation {
    /// Every generation, oldest first.
    pub const ALL: [Generation; 3] = [Generation::V0, Generation::V1, Generation::V2];

    /// Bytes before `primary`: the v2 doorbell record.
    pub const fn prefix(self) -> usize {
        match self {
            Generation::V0 | Generation::V1 => 0,
            Generation::V2 => 64,
        }
    }

    /// The largest port count of this generation.
    pub const fn max_port_count(self) -> u32 {
        match self {
            Generation::V0 => 512,
            Generation::V1 => 4096,
            Generation::V2 => 16384,
        }
    }

    /// The port count of a mailbox for a device that runs `parallelism` warps at once: one
    /// port per resident warp (fewer can deadlock a GPU whose resident warps all wait, LLVM PR
    /// #79200), at most this generation's maximum, at least one. The one place a plugin's
    /// hardware figure becomes `N`.
    pub const fn ports_for(self, parallelism: u32) -> u32 {
        let max = self.max_port_count();
        if parallelism == 0 {
            1
        } else if parallelism > max {
            max
        } else {
            parallelism
        }
    }

    /// Size of the device-side client object (`__llvm_rpc_client`, or the object
    /// `__llvm_libc_rpc_client` points to).
    pub const fn client_object_size(self) -> usize {
        self.client_object_locks() + 4 * (self.max_port_count() as usize / 32)
    }

    /// Offset of the lock words in the client object: after `port_count` + padding and the
    /// pointers (\[doorbell\], inbox, outbox, \[header\], packet). A multiple of 8.
    pub const fn client_object_locks(self) -> usize {
        let pointers = match self {
            Generation::V0 => 3,
            Generation::V1 => 4,
            Generation::V2 => 5,
        };
        8 + 8 * pointers
    }

    /// The generation whose client object has `size` bytes.
    pub fn from_client_object_size(size: usize) -> Result<Self, ProtocolError> {
        Generation::ALL
            .into_iter()
            .find(|g| g.client_object_size() == size)
            .ok_or(ProtocolError::BadClientObjectSize(size))
    }
}

const_assert_eq!(Generation::V0.client_object_size(), 96);
const_assert_eq!(Generation::V1.client_object_size(), 552);
const_assert_eq!(Generation::V2.client_object_size(), 2096);
const_assert_eq!(Generation::V0.client_object_locks(), 32);
const_assert_eq!(Generation::V1.client_object_locks(), 40);
const_assert_eq!(Generation::V2.client_object_locks(), 48);

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Generation::V0 => "v0",
            Generation::V1 => "v1",
            Generation::V2 => "v2",
        })
    }
}

impl FromStr for Generation {
    type Err = ProtocolError;
    fn from_str(s: &str) -> Result<Self, ProtocolError> {
        match s {
            "v0" => Ok(Generation::V0),
            "v1" => Ok(Generation::V1),
            "v2" => Ok(Generation::V2),
            #[cfg(feature = "std")]
            _ => Err(ProtocolError::BadGeneration(s.into())),
            #[cfg(not(feature = "std"))]
            _ => Err(ProtocolError::BadGeneration("(not v0, v1 or v2)")),
        }
    }
}

/// A validated mailbox shape: generation, port count `N`, lane size `L`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    generation: Generation,
    ports: u32,
    lanes: u32,
}

/// `alignof(Packet)` in LLVM 18's layout (`struct alignas(64) Packet`).
const V0_PACKET_ALIGN: usize = 64;

const fn align_up(value: usize, align: usize) -> usize {
    value.div_ceil(align) * align
}

impl Layout {
    /// A layout, or an error for a port count outside `1..=MAX_PORT_COUNT` or a lane size not
    /// in {1, 32, 64}.
    pub fn new(generation: Generation, ports: u32, lanes: u32) -> Result<Self, ProtocolError> {
        if !LANE_SIZES.contains(&lanes) {
            return Err(ProtocolError::BadLaneSize(lanes));
        }
        let max = generation.max_port_count();
        if ports == 0 || ports > max {
            return Err(ProtocolError::BadPortCount {
                ports,
                max,
                generation,
            });
        }
        Ok(Layout {
            generation,
            ports,
            lanes,
        })
    }

    /// The generation.
    pub const fn generation(&self) -> Generation {
        self.generation
    }
    /// `N`.
    pub const fn ports(&self) -> u32 {
        self.ports
    }
    /// `L`.
    pub const fn lanes(&self) -> u32 {
        self.lanes
    }
    /// The header mask bits that name real lanes.
    pub const fn lane_mask(&self) -> u64 {
        if self.lanes == 64 {
            u64::MAX
        } else {
            (1u64 << self.lanes) - 1
        }
    }

    /// Offset of the server's words.
    pub const fn primary(&self) -> usize {
        self.generation.prefix()
    }
    /// Offset of the client's words.
    pub const fn secondary(&self) -> usize {
        self.primary() + 4 * self.ports as usize
    }
    /// Offset of port 0's header: the header array (v1, v2), or the packet array whose
    /// packets start with their headers (v0: at the packets' 64-byte alignment, LLVM 18's).
    pub const fn header(&self) -> usize {
        match self.generation {
            Generation::V0 => align_up(8 * self.ports as usize, V0_PACKET_ALIGN),
            Generation::V1 | Generation::V2 => self.primary() + 8 * self.ports as usize,
        }
    }
    /// Offset of port 0's lane 0 buffer: right after the headers at `Buffer`'s alignment
    /// (LLVM's; v1, v2), or after port 0's header inside its packet (v0).
    pub const fn packet(&self) -> usize {
        match self.generation {
            Generation::V0 => self.header() + size_of::<Header>(),
            Generation::V1 | Generation::V2 => align_up(
                self.header() + size_of::<Header>() * self.ports as usize,
                align_of::<Buffer>(),
            ),
        }
    }
    /// Bytes from one port's header to the next one's.
    pub(crate) const fn header_stride(&self) -> usize {
        match self.generation {
            Generation::V0 => self.v0_packet_size(),
            Generation::V1 | Generation::V2 => size_of::<Header>(),
        }
    }
    /// Bytes from one port's lane 0 buffer to the next port's.
    pub const fn packet_stride(&self) -> usize {
        match self.generation {
            Generation::V0 => self.v0_packet_size(),
            Generation::V1 | Generation::V2 => BUFFER_SIZE * self.lanes as usize,
        }
    }
    /// LLVM 18's `sizeof(Packet<L>)`: the header and `L` buffers, rounded up to 64.
    const fn v0_packet_size(&self) -> usize {
        align_up(
            size_of::<Header>() + BUFFER_SIZE * self.lanes as usize,
            V0_PACKET_ALIGN,
        )
    }
    /// Offset of port `port`'s header.
    pub const fn header_of(&self, port: u32) -> usize {
        self.header() + self.header_stride() * port as usize
    }
    /// Offset of port `port`'s lane `lane` buffer.
    pub const fn packet_of(&self, port: u32, lane: u32) -> usize {
        self.packet() + self.packet_stride() * port as usize + BUFFER_SIZE * lane as usize
    }
    /// Total bytes of the region (LLVM's `allocation_size`).
    pub const fn total_size(&self) -> usize {
        match self.generation {
            Generation::V0 => self.header() + self.v0_packet_size() * self.ports as usize,
            Generation::V1 | Generation::V2 => {
                self.packet() + BUFFER_SIZE * self.lanes as usize * self.ports as usize
            }
        }
    }
    /// Bytes of the device-side client object.
    pub const fn client_object_size(&self) -> usize {
        self.generation.client_object_size()
    }

    /// Writes the device-side client object for a mailbox whose base the device sees at
    /// `device_base` into `out`, which must be exactly [`Layout::client_object_size`] bytes.
    #[cfg(feature = "std")]
    pub(crate) fn write_client_object(
        &self,
        device_base: u64,
        out: &mut [u8],
    ) -> Result<(), ProtocolError> {
        if out.len() != self.client_object_size() {
            return Err(ProtocolError::BadClientObjectSize(out.len()));
        }
        out.fill(0);
        out[..4].copy_from_slice(&self.ports.to_le_bytes());
        let at = |offset: usize| device_base + offset as u64;
        let (primary, secondary, header, packet) = (
            at(self.primary()),
            at(self.secondary()),
            at(self.header()),
            at(self.packet()),
        );
        // LLVM 18's object points at the packet array, whose packets start with the headers.
        let (pointers, count) = match self.generation {
            Generation::V0 => ([primary, secondary, header, 0, 0], 3),
            Generation::V1 => ([primary, secondary, header, packet, 0], 4),
            // The doorbell record sits at offset 0.
            Generation::V2 => ([device_base, primary, secondary, header, packet], 5),
        };
        for (k, pointer) in pointers[..count].iter().enumerate() {
            out[8 + 8 * k..16 + 8 * k].copy_from_slice(&pointer.to_le_bytes());
        }
        Ok(())
    }

    /// The client object bytes for a mailbox the device sees at `device_base`.
    #[cfg(feature = "std")]
    pub fn client_object(&self, device_base: u64) -> std::vec::Vec<u8> {
        let mut out = std::vec![0u8; self.client_object_size()];
        self.write_client_object(device_base, &mut out)
            .expect("the buffer has the client object's size");
        out
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} N={} L={}", self.generation, self.ports, self.lanes)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn protocol_test_vectors() {
        // (gen, N, L, primary, secondary, header, packet, total) from PROTOCOL section 2; the
        // v0 totals are LLVM 18's `Server<L>::allocation_size(N)` (`cargo xtask llvm-client`
        // checks them against LLVM 18's own code).
        let vectors = [
            (Generation::V0, 1, 1, 0, 4, 64, 80, 192),
            (Generation::V0, 3, 1, 0, 12, 64, 80, 448),
            (Generation::V0, 9, 64, 0, 36, 128, 144, 37568),
            (Generation::V0, 64, 32, 0, 256, 512, 528, 135680),
            (Generation::V0, 512, 1, 0, 2048, 4096, 4112, 69632),
            (Generation::V0, 512, 64, 0, 2048, 4096, 4112, 2134016),
            (Generation::V1, 1, 1, 0, 4, 8, 24, 88),
            (Generation::V1, 3, 1, 0, 12, 24, 72, 264),
            (Generation::V2, 1, 1, 64, 68, 72, 88, 152),
            (Generation::V2, 5, 32, 64, 84, 104, 184, 10424),
            (Generation::V1, 64, 32, 0, 256, 512, 1536, 132608),
            (Generation::V1, 4096, 64, 0, 16384, 32768, 98304, 16875520),
            (Generation::V1, 4096, 32, 0, 16384, 32768, 98304, 8486912),
            (Generation::V2, 64, 32, 64, 320, 576, 1600, 132672),
            (
                Generation::V2,
                16384,
                64,
                64,
                65600,
                131136,
                393280,
                67502144,
            ),
        ];
        for (generation, n, l, primary, secondary, header, packet, total) in vectors {
            let layout = Layout::new(generation, n, l).unwrap();
            let got = (
                layout.primary(),
                layout.secondary(),
                layout.header(),
                layout.packet(),
                layout.total_size(),
            );
            assert_eq!(got, (primary, secondary, header, packet, total), "{layout}");
        }
    }

    /// What every plugin's mailbox gets from its hardware figure (`Device::parallelism`).
    #[test]
    fn ports_for_is_the_parallelism_capped_by_the_generation_and_at_least_one() {
        // An H200 runs 8448 warps at once; an MI300X 9728 waves.
        assert_eq!(Generation::V1.ports_for(8448), 4096);
        assert_eq!(Generation::V2.ports_for(8448), 8448);
        assert_eq!(Generation::V2.ports_for(9728), 9728);
        assert_eq!(Generation::V0.ports_for(3520), 512);
        // A big part past every cap; nonsense figures still give a usable mailbox.
        assert_eq!(Generation::V2.ports_for(u32::MAX), 16384);
        assert_eq!(Generation::V1.ports_for(0), 1);
    }

    #[test]
    fn client_object_sizes_give_the_generation() {
        assert_eq!(Generation::V0.client_object_size(), 96);
        assert_eq!(Generation::from_client_object_size(96), Ok(Generation::V0));
        assert_eq!(Generation::V1.client_object_size(), 552);
        assert_eq!(Generation::V2.client_object_size(), 2096);
        assert_eq!(Generation::from_client_object_size(552), Ok(Generation::V1));
        assert_eq!(
            Generation::from_client_object_size(2096),
            Ok(Generation::V2)
        );
        assert_eq!(
            Generation::from_client_object_size(8),
            Err(ProtocolError::BadClientObjectSize(8))
        );
    }

    #[test]
    fn client_object_bytes() {
        let base = 0x7f00_0000_1000u64;
        let word =
            |bytes: &[u8], at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        // LLVM 18's `Client` and the later one begin alike: the port count, inbox, outbox and
        // the packet array.
        let count_and_buffers = |bytes: &[u8]| {
            assert_eq!(u32::from_le_bytes(bytes[..4].try_into().unwrap()), 64);
            assert_eq!(&bytes[4..8], &[0; 4]);
            assert_eq!(word(bytes, 8), base);
            assert_eq!(word(bytes, 16), base + 256);
            assert_eq!(word(bytes, 24), base + 512);
        };
        let v1 = Layout::new(Generation::V1, 64, 32).unwrap();
        let bytes = v1.client_object(base);
        assert_eq!(bytes.len(), 552);
        count_and_buffers(&bytes);
        assert_eq!(word(&bytes, 32), base + 1536);
        assert!(bytes[40..].iter().all(|&b| b == 0));

        let v2 = Layout::new(Generation::V2, 64, 32).unwrap();
        let bytes = v2.client_object(base);
        assert_eq!(bytes.len(), 2096);
        assert_eq!(word(&bytes, 8), base, "doorbell record");
        assert_eq!(word(&bytes, 16), base + 64);
        assert_eq!(word(&bytes, 24), base + 320);
        assert_eq!(word(&bytes, 32), base + 576);
        assert_eq!(word(&bytes, 40), base + 1600);
        assert!(bytes[48..].iter().all(|&b| b == 0));

        // LLVM 18's `Client`: port count, inbox, outbox, the packet array, 16 lock words.
        let v0 = Layout::new(Generation::V0, 64, 32).unwrap();
        let bytes = v0.client_object(base);
        assert_eq!(bytes.len(), 96);
        count_and_buffers(&bytes);
        assert!(bytes[32..].iter().all(|&b| b == 0));
    }

    #[test]
    fn llvm18_packets_hold_their_headers() {
        for lanes in LANE_SIZES {
            let l = Layout::new(Generation::V0, 7, lanes).unwrap();
            let packet = 64 + 64 * lanes as usize;
            assert_eq!(l.header_stride(), packet);
            assert_eq!(l.packet_stride(), packet);
            assert_eq!(l.header(), 64, "align_up(8 * 7, 64)");
            assert_eq!(l.header_of(3), 64 + 3 * packet);
            assert_eq!(l.packet_of(3, 0), l.header_of(3) + 16);
            assert_eq!(
                l.packet_of(3, lanes - 1),
                l.header_of(3) + 16 + 64 * (lanes as usize - 1)
            );
            assert_eq!(l.total_size(), 64 + 7 * packet);
        }
        assert!(Layout::new(Generation::V0, 512, 64).is_ok());
        assert!(matches!(
            Layout::new(Generation::V0, 513, 1),
            Err(ProtocolError::BadPortCount { max: 512, .. })
        ));
        assert_eq!("v0".parse::<Generation>(), Ok(Generation::V0));
    }

    #[test]
    fn invalid_parameters_are_errors() {
        assert_eq!(
            Layout::new(Generation::V1, 1, 16),
            Err(ProtocolError::BadLaneSize(16))
        );
        assert!(matches!(
            Layout::new(Generation::V1, 0, 1),
            Err(ProtocolError::BadPortCount { .. })
        ));
        assert!(matches!(
            Layout::new(Generation::V1, 4097, 1),
            Err(ProtocolError::BadPortCount { .. })
        ));
        assert!(Layout::new(Generation::V2, 16384, 64).is_ok());
        assert!(matches!(
            Layout::new(Generation::V2, 16385, 64),
            Err(ProtocolError::BadPortCount { .. })
        ));
        let layout = Layout::new(Generation::V1, 1, 1).unwrap();
        assert!(layout.write_client_object(0, &mut [0u8; 10]).is_err());
        let unknown = "v9".parse::<Generation>().unwrap_err().to_string();
        assert!(
            unknown.contains("\"v9\" (expected v0, v1 or v2)"),
            "{unknown}"
        );
    }

    #[test]
    fn every_shape_is_consistent() {
        for generation in Generation::ALL {
            for lanes in LANE_SIZES {
                for ports in [1, 2, 3, 63, 64, 65, 500, generation.max_port_count()] {
                    let l = Layout::new(generation, ports, lanes).unwrap();
                    let last = ports - 1;
                    assert_eq!(l.packet() % 8, 0);
                    assert_eq!(l.header_of(0), l.header());
                    assert_eq!(l.packet_of(0, 0), l.packet());
                    // Every header and buffer inside the region, none overlapping another.
                    assert!(l.header_of(last) + 16 <= l.total_size());
                    assert!(l.packet_of(last, lanes - 1) + 64 <= l.total_size());
                    if generation == Generation::V0 {
                        assert_eq!(l.header() % 64, 0);
                        assert_eq!(l.packet(), l.header() + 16);
                        assert!(l.header() >= l.secondary() + 4 * ports as usize);
                    } else {
                        assert_eq!(l.packet(), l.header() + 16 * ports as usize);
                        assert_eq!(l.total_size(), l.packet() + 64 * (lanes * ports) as usize);
                    }
                }
            }
        }
    }
}
