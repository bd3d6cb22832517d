//! The printf format parser and formatter (`rpc_core::printf`) on fuzzed formats and argument
//! buffers. Input: one flags byte (bit 0: packed), then the format up to the first NUL, then the
//! raw argument buffer. Checked: no panic; a format that parses and an argument buffer of at
//! least `args_size` bytes always formats; `string_pointers` finds exactly the non-null `%s`
//! pointers the formatter asks for; each conversion prints a bounded number of bytes.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use rpc_core::printf::{args_size, format, parse, string_pointers, Piece, MAX_FIELD};

/// What a fetched `%s` string is (long enough to take several packets on the wire).
const FETCHED: &[u8] = b"a device string of some length, fetched from the device\0trailing";

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let packed = flags & 1 == 1;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let (format_bytes, args) = (&rest[..end], rest.get(end + 1..).unwrap_or_default());
    let Ok(pieces) = parse(format_bytes) else {
        return;
    };
    let size = args_size(&pieces, packed);
    let specs = pieces
        .iter()
        .filter(|p| matches!(p, Piece::Spec(_)))
        .count();
    let pointers = string_pointers(&pieces, args, packed);
    let asked = RefCell::new(Vec::new());
    let fetch = |ptr: u64| {
        asked.borrow_mut().push(ptr);
        (!ptr.is_multiple_of(3)).then(|| FETCHED.to_vec())
    };
    let out = format(&pieces, args, packed, &fetch);
    if args.len() >= size {
        let out = out.expect("a parsed format with enough arguments formats");
        let pointers = pointers.expect("a parsed format with enough arguments has pointers");
        assert_eq!(
            pointers,
            *asked.borrow(),
            "the %s pointers the formatter fetched"
        );
        let bound = format_bytes.len() + specs * (3 * MAX_FIELD + 1024);
        assert!(out.len() <= bound, "{} bytes of output", out.len());
    }
});
