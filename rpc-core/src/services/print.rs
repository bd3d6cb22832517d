//! printf (opcodes 21-26, PROTOCOL section 7), every lane on its own:
//!
//! 1. STREAM variants: C send buf\[0\] = raw stream handle.
//! 2. C send_n(format incl. NUL).
//! 3. S send buf\[0\] = bytes of arguments the format needs ([`crate::printf::args_size`]);
//!    0 for a lane whose handle or format is refused.
//! 4. C send_n(argument buffer).
//! 5. While any lane has a non-null `%s` pointer not yet fetched: S send {buf\[0\] = 0,
//!    buf\[1\] = the lane's next pointer, last-first as LLVM asks, or 0}; C send_n(the string
//!    incl. NUL, or nothing for 0).
//! 6. S formats and writes each lane's output whole (one write per lane), then
//!    S send {buf\[0\] = bytes written or -1, buf\[1\] = 0}.
//!
//! A lane gets -1 and no output for a bad handle, a format that does not parse or an argument
//! buffer shorter than the format needs; the script completes in those cases. A format, an
//! argument buffer or a string above the stream bound ends the exchange at once (see
//! [`super`]).

use std::collections::HashMap;
use std::format;
use std::string::String;
use std::vec::Vec;

use super::streams::Target;
use super::{active, c_result, per_lane, recv_words, Refusals};
use crate::opcode::Opcode;
use crate::printf::{args_size, format, parse, string_pointers, Piece};
use crate::registry::Request;
use crate::Result;

/// Where one lane stands.
enum Lane<'f> {
    /// Refused: the lane answers -1.
    Refused,
    /// Parsed, printing to the target.
    Parsed(Vec<Piece<'f>>, Target),
}

/// Serves every PRINTF_TO_* opcode.
pub(crate) async fn printf(mut req: Request) -> Result<()> {
    let opcode = req.opcode();
    let packed = matches!(
        opcode,
        Opcode::PRINTF_TO_STDOUT_PACKED
            | Opcode::PRINTF_TO_STDERR_PACKED
            | Opcode::PRINTF_TO_STREAM_PACKED
    );
    let context = super::context(&req);
    let services = &context.services;
    let mut refusals = Refusals::default();

    // 1. The stream of each lane.
    let stream = matches!(
        opcode,
        Opcode::PRINTF_TO_STREAM | Opcode::PRINTF_TO_STREAM_PACKED
    );
    let handles = if stream {
        Some(recv_words(&mut req).await?)
    } else {
        None
    };
    let target = |lane: u32| -> Option<Target> {
        match (&handles, opcode) {
            (Some(words), _) => services.raw(words[lane as usize][0]),
            (None, Opcode::PRINTF_TO_STDERR | Opcode::PRINTF_TO_STDERR_PACKED) => {
                Some(Target::Stderr)
            }
            (None, _) => Some(Target::Stdout),
        }
    };

    // 2, 3. The formats, and the argument sizes they need.
    let formats = req.recv_n().await?;
    let mut lanes: Vec<Lane<'_>> = (0..req.lane_size()).map(|_| Lane::Refused).collect();
    let mut sizes = per_lane(&req, 0u64);
    for lane in active(&req) {
        let i = lane as usize;
        let format = &formats[i];
        let Some(target) = target(lane) else {
            let handle = handles.as_ref().map_or(0, |w| w[i][0]);
            refusals.lane(lane, format!("{handle:#x} is not a live stream handle"));
            continue;
        };
        match parse(format) {
            Ok(pieces) => {
                sizes[i] = args_size(&pieces, packed) as u64;
                lanes[i] = Lane::Parsed(pieces, target);
            }
            Err(error) => refusals.lane(lane, format!("{error} in {}", quoted(format))),
        }
    }
    req.send(|lane, p| p.set_word(0, sizes[lane as usize]))
        .await?;

    // 4. The arguments, and the strings they point to.
    let args = req.recv_n().await?;
    let mut pending: Vec<Vec<u64>> = per_lane(&req, Vec::new());
    for lane in active(&req) {
        let i = lane as usize;
        let Lane::Parsed(pieces, _) = &lanes[i] else {
            continue;
        };
        match string_pointers(pieces, &args[i], packed) {
            Ok(pointers) => pending[i] = pointers,
            Err(why) => {
                refusals.lane(lane, format!("{why} for {}", quoted(&formats[i])));
                lanes[i] = Lane::Refused;
            }
        }
    }

    // 5. Fetch the strings, last-first.
    let mut strings: Vec<HashMap<u64, Vec<u8>>> = per_lane(&req, HashMap::new());
    while active(&req).any(|lane| !pending[lane as usize].is_empty()) {
        let mut asked = per_lane(&req, 0u64);
        for lane in active(&req) {
            asked[lane as usize] = pending[lane as usize].pop().unwrap_or(0);
        }
        req.send(|lane, p| {
            p.set_word(0, 0);
            p.set_word(1, asked[lane as usize]);
        })
        .await?;
        let mut fetched = req.recv_n().await?;
        for lane in active(&req) {
            let i = lane as usize;
            if asked[i] != 0 {
                strings[i].insert(asked[i], std::mem::take(&mut fetched[i]));
            }
        }
    }

    // 6. Format, print (on an I/O thread if any lane prints to a file), reply.
    let mut outputs = Vec::new();
    for lane in active(&req) {
        let i = lane as usize;
        let Lane::Parsed(pieces, target) = &mut lanes[i] else {
            continue;
        };
        let strings = &strings[i];
        match format(pieces, &args[i], packed, &|p| strings.get(&p).cloned()) {
            Ok(out) => outputs.push((lane, std::mem::replace(target, Target::Stdout), out)),
            Err(error) => refusals.lane(lane, error),
        }
    }
    let blocks = outputs.iter().any(|(_, target, _)| target.may_block());
    let written = super::io(&req, blocks, move |context| {
        outputs
            .into_iter()
            .map(|(lane, target, out)| {
                let written = context.services.write(&target, &out);
                (lane, (written == out.len()).then_some(out.len() as u64))
            })
            .collect::<Vec<_>>()
    })
    .await?;
    let mut results = per_lane(&req, c_result(-1));
    for (lane, written) in written {
        results[lane as usize] = written.unwrap_or(c_result(-1));
    }
    req.send(|lane, p| {
        p.set_word(0, results[lane as usize]);
        p.set_word(1, 0);
    })
    .await?;
    refusals.finish()
}

/// A format for a log line: lossy UTF-8, quoted, cut at 80 characters.
fn quoted(format: &[u8]) -> String {
    let text = String::from_utf8_lossy(super::until_nul(format));
    let cut: String = text.chars().take(80).collect();
    if cut.len() < text.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}
