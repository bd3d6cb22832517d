//! The printf format parser and formatter (`rpc_core::services::printf`) on fuzzed formats and argument
//! buffers. Input: one flags byte (bit 0: packed), then the format up to the first NUL, then the
//! raw argument buffer. A `%s` pointer's string is made from the pointer: none for a multiple of
//! 7 (printed as null), 70,000 bytes (above `CHUNK`) for a multiple of 61, else up to 600.
//! Checked: no panic; a format that parses and an argument buffer of at least `args_size` bytes
//! always formats (every format parses); `string_pointers` finds exactly the non-null `%s` pointers the formatter
//! asks for; each conversion prints a bounded number of bytes; and `format_to` hands its sink
//! pieces of `CHUNK` bytes, the last one shorter (so none is above `CHUNK + MAX_FIELD`, not
//! even with a `%s` string longer than a chunk), which put together are `format`'s output.
#![no_main]

use std::cell::RefCell;
use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use rpc_core::services::printf::{
    args_size, format, format_to, parse, string_pointers, Piece, CHUNK, MAX_FIELD,
};

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
    let pieces = parse(format_bytes);
    let size = args_size(&pieces, packed);
    let specs = pieces
        .iter()
        .filter(|p| matches!(p, Piece::Spec(_) | Piece::Malformed { .. }))
        .count();
    let pointers = string_pointers(&pieces, args, packed);
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
    let out = format(&pieces, args, packed, &fetch);
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
    format_to(
        &pieces,
        args,
        packed,
        &|ptr| strings.get(&ptr).map(Vec::as_slice),
        &mut |piece| {
            assert!(piece.len() <= CHUNK, "a piece of {} bytes", piece.len());
            sizes.push(piece.len());
            joined.extend_from_slice(piece);
        },
    )
    .expect("formats as `format` did");
    sizes.pop();
    assert!(
        sizes.iter().all(|&n| n == CHUNK),
        "pieces of {sizes:?} bytes"
    );
    assert!(joined == out, "the pieces are not format()'s output");
});
