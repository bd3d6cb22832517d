//! The printf format parser (`rpc_core::protocol::printf`) and formatter
//! (`rpc_core::services::printf::Format`) on fuzzed formats and argument buffers. Input: one flags byte (bit 0: packed), then the format up to the first NUL, then the
//! raw argument buffer. A `%s` pointer's string is made from the pointer: none for a multiple of
//! 7 (printed as null), 70,000 bytes (above `CHUNK`) for a multiple of 61, else up to 600.
//! Checked: no panic; a format that parses and an argument buffer of at least `args_size` bytes
//! always formats (every format parses); `string_pointers` finds exactly the non-null `%s`
//! pointers the formatter asks for; each conversion prints a bounded number of bytes; and
//! `write` hands a `Sink::Chunks` pieces of `CHUNK` bytes, the last one shorter (so none is
//! above `CHUNK + MAX_FIELD`, not even with a `%s` string longer than a chunk), which put
//! together are the line it appends to a `Sink::Append`.
#![no_main]

use std::cell::RefCell;
use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use rpc_core::protocol::printf::{parse, Piece, MAX_FIELD};
use rpc_core::protocol::Dialect;
use rpc_core::services::printf::{Format, Sink, CHUNK};

/// The device string at `ptr`, if it was fetched.
fn fetched(ptr: u64) -> Option<Vec<u8>> {
    if ptr.is_multiple_of(7) {
        return None;
    }
    let len = if ptr.is_multiple_of(61) {
        70_000
    } else {
        (ptr >> 3) as usize % 600
    };
    let mut string: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
    string.extend_from_slice(b"\0after the NUL");
    Some(string)
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let packed = flags & 1 == 1;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let (format_bytes, args) = (&rest[..end], rest.get(end + 1..).unwrap_or_default());
    let format = Format::new(Dialect::HostC, format_bytes, packed);
    let size = format.args_size();
    let specs = parse(Dialect::HostC, format_bytes)
        .filter(|p| matches!(p, Piece::Spec(_) | Piece::Malformed { .. }))
        .count();
    let mut found = Vec::new();
    let pointers = format.string_pointers(args, &mut found).map(|()| found);
    // The strings the formatter may ask for, fetched up front: it borrows them.
    let strings: HashMap<u64, Vec<u8>> = pointers
        .iter()
        .flatten()
        .filter_map(|&ptr| Some((ptr, fetched(ptr)?)))
        .collect();
    let asked = RefCell::new(Vec::new());
    let fetch = |ptr: u64| {
        asked.borrow_mut().push(ptr);
        strings.get(&ptr).map(Vec::as_slice)
    };
    let mut out = Vec::new();
    let out = format.write(args, &fetch, Sink::Append(&mut out)).map(|()| out);
    if args.len() < size {
        return;
    }
    let out = out.expect("a parsed format with enough arguments formats");
    let pointers = pointers.expect("a parsed format with enough arguments has pointers");
    assert_eq!(
        pointers,
        *asked.borrow(),
        "the %s pointers the formatter fetched"
    );
    // Each %s prints at most its string (or its width); every other conversion is bounded.
    let string_len = |ptr: u64| fetched(ptr).map_or(0, |s| s.iter().position(|&b| b == 0).unwrap());
    let string_bytes: usize = pointers.iter().map(|&p| string_len(p)).sum();
    let bound = format_bytes.len() + specs * (3 * MAX_FIELD + 1024) + string_bytes;
    assert!(out.len() <= bound, "{} bytes of output", out.len());

    // The same output in pieces: whole chunks, the last one shorter (so none is above
    // `CHUNK + MAX_FIELD`, not even with a `%s` string).
    let mut sizes = Vec::new();
    let mut joined = Vec::new();
    let mut sink = |piece: &[u8]| {
        assert!(piece.len() <= CHUNK, "a piece of {} bytes", piece.len());
        sizes.push(piece.len());
        joined.extend_from_slice(piece);
    };
    format
        .write(
            args,
            &|ptr| strings.get(&ptr).map(Vec::as_slice),
            Sink::Chunks(&mut sink),
        )
        .expect("formats as the whole line did");
    sizes.pop();
    assert!(
        sizes.iter().all(|&n| n == CHUNK),
        "pieces of {sizes:?} bytes"
    );
    assert!(joined == out, "the pieces are not the whole line");
});
