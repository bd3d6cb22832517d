//! Reading a CUDA fat binary (the `__nv_fatbin` container `nvcc -fatbin` writes, which the
//! driver loads as it is) without a driver: its entries, each PTX text or a cubin for one
//! architecture, possibly compressed.
//!
//! The layout relied on (little-endian; NVIDIA's `fatbinary_section.h` names the container's
//! magic and version, public fat binary readers agree on the rest):
//! - a container header of 16 bytes: `u32` magic `0xBA55ED50`, `u16` version (1), `u16`
//!   header size, `u64` bytes of entries after the header. A file may hold several
//!   containers back to back;
//! - per entry a header: `u16` kind (1 PTX, 2 ELF), `u16` (unknown), `u32` header size (the
//!   payload starts that far from the entry), `u64` payload bytes, `u32` compressed bytes,
//!   `u32` (unknown), `u16` minor and `u16` major version, `u32` architecture (90: `sm_90`),
//!   `u32` name offset and `u32` name length, `u64` flags (`0x1` 64-bit, `0x10` Linux,
//!   `0x2000` LZ4-compressed, `0x8000` zstd-compressed), `u64` (zero) and `u64` uncompressed
//!   bytes: 64 bytes in all. The next entry follows the payload.
//!
//! Compressed payloads are not inflated here (the driver does it): such an entry is
//! reported as compressed and not read further.

/// The container's magic number.
pub const MAGIC: u32 = 0xBA55_ED50;

const CONTAINER_HEADER: usize = 16;
const ENTRY_HEADER: usize = 64;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;

/// What an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ptx,
    Elf,
    /// A kind this reader does not know.
    Other(u16),
}

/// One entry of a fat binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    pub kind: Kind,
    /// The architecture number (90 for `sm_90`).
    pub arch: u32,
    /// `major.minor` (for PTX, the PTX ISA version).
    pub version: (u16, u16),
    /// How the payload is compressed (`"lz4"`, `"zstd"`), `None` when it is not.
    pub compression: Option<&'static str>,
    /// The payload as stored (compressed or not).
    pub payload: &'a [u8],
}

/// Why a file is not a readable fat binary.
#[derive(Debug, PartialEq, Eq)]
pub struct BadFatbin(pub String);

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from(u32_at(bytes, at)) | u64::from(u32_at(bytes, at + 4)) << 32
}

/// `bytes[at..at + len]`, or why not.
fn range(
    bytes: &[u8],
    at: usize,
    len: u64,
    what: &str,
) -> Result<std::ops::Range<usize>, BadFatbin> {
    usize::try_from(len)
        .ok()
        .and_then(|len| at.checked_add(len))
        .filter(|&end| end <= bytes.len())
        .map(|end| at..end)
        .ok_or_else(|| BadFatbin(format!("{what} at byte {at} runs past the end of the file")))
}

/// Whether `bytes` start like a fat binary.
pub fn is_fatbin(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && u32_at(bytes, 0) == MAGIC
}

/// Every entry of every container in `bytes`.
pub fn read(bytes: &[u8]) -> Result<Vec<Entry<'_>>, BadFatbin> {
    let mut entries = Vec::new();
    let mut at = 0;
    // Containers back to back; trailing padding (zeros) ends the list.
    while at < bytes.len() && bytes[at..].iter().any(|&b| b != 0) {
        let header = range(bytes, at, CONTAINER_HEADER as u64, "a container header")?;
        let header = &bytes[header];
        if u32_at(header, 0) != MAGIC {
            return Err(BadFatbin(format!("no fat binary magic at byte {at}")));
        }
        let header_size = usize::from(u16_at(header, 6)).max(CONTAINER_HEADER);
        let body = range(bytes, at + header_size, u64_at(header, 8), "the entries")?;
        let end = body.end;
        let mut next = body.start;
        while next < end {
            let head = range(bytes, next, ENTRY_HEADER as u64, "an entry header")?;
            if head.end > end {
                return Err(BadFatbin(format!(
                    "the entry header at byte {next} runs past its container"
                )));
            }
            let head = &bytes[head];
            let entry_header = u32_at(head, 4) as usize;
            if entry_header < ENTRY_HEADER {
                return Err(BadFatbin(format!(
                    "the entry at byte {next} has a {entry_header}-byte header"
                )));
            }
            let payload = range(
                bytes,
                next.saturating_add(entry_header),
                u64_at(head, 8),
                "a payload",
            )?;
            if payload.end > end {
                return Err(BadFatbin(format!(
                    "the payload of the entry at byte {next} runs past its container"
                )));
            }
            let flags = u64_at(head, 40);
            entries.push(Entry {
                kind: match u16_at(head, 0) {
                    1 => Kind::Ptx,
                    2 => Kind::Elf,
                    other => Kind::Other(other),
                },
                arch: u32_at(head, 28),
                version: (u16_at(head, 26), u16_at(head, 24)),
                compression: if flags & FLAG_ZSTD != 0 {
                    Some("zstd")
                } else if flags & FLAG_LZ4 != 0 {
                    Some("lz4")
                } else {
                    None
                },
                payload: &bytes[payload.clone()],
            });
            next = payload.end;
        }
        at = end;
    }
    if entries.is_empty() {
        return Err(BadFatbin("a fat binary with no entries".into()));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncations_are_errors_not_panics() {
        let mut container = MAGIC.to_le_bytes().to_vec();
        container.extend(1u16.to_le_bytes());
        container.extend(16u16.to_le_bytes());
        container.extend(64u64.to_le_bytes());
        assert!(read(&container).is_err(), "entries past the end");
        container.extend([0; 64]);
        // A zero header size is refused rather than looping.
        assert!(read(&container).is_err());
        container[16 + 4] = 64;
        let entries = read(&container).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].kind, Kind::Other(0));
        for len in 0..container.len() {
            let _ = read(&container[..len]);
        }
    }
}
