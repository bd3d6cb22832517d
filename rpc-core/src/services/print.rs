//! printf (opcodes 21-26, PROTOCOL section 7), every lane on its own:
//!
//! 1. STREAM variants: C send buf\[0\] = raw stream handle.
//! 2. C send_n(format incl. NUL).
//! 3. S send buf\[0\] = bytes of arguments the format needs ([`crate::services::printf::args_size`]);
//!    0 for a lane whose handle or format is refused.
//! 4. C send_n(argument buffer).
//! 5. While any lane has a non-null `%s` pointer not yet fetched: S send {buf\[0\] = 0,
//!    buf\[1\] = the lane's next pointer, last-first as LLVM asks, or 0}; C send_n(the string
//!    incl. NUL, or nothing for 0). A pointer printed twice is fetched once.
//! 6. S formats each lane's output and writes it to the lane's stream in pieces of
//!    [`CHUNK`] bytes (one write for a shorter output, and never the whole of a longer one in
//!    memory), then S send {buf\[0\] = bytes written or -1, buf\[1\] = 0}.
//!
//! A lane gets -1 and no output for a bad handle, a format that does not parse, an argument
//! buffer shorter than the format needs, or `%s` strings above `Limits::printf_string_bytes`
//! (the request's lanes together); the script completes in those cases. A format, an argument
//! buffer or a string above the stream limits ends the exchange at once (see [`super`]).
//!
//! Output that may be long (above [`CHUNK`], by [`output_bound`]) or goes to a file is
//! formatted and written on an I/O thread, so that the server thread never spends long on one
//! request.

use std::collections::HashMap;
use std::format;
use std::string::String;
use std::vec::Vec;

use super::streams::Target;
use super::{active, c_result, per_lane, recv_words, Refusals};
use crate::protocol::opcode::Opcode;
use crate::server::registry::Request;
use crate::services::printf::{
    args_size, format_to, output_bound, parse, string_pointers, Piece, CHUNK,
};
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
    let services = &context.services();
    let mailbox = req.mailbox().id;
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
            (Some(words), _) => services.raw(mailbox, words[lane as usize][0]),
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

    // 5. Fetch the strings, last-first, each pointer once, within the request's budget.
    let mut budget = context.config.limits.printf_string_bytes;
    let mut strings: Vec<HashMap<u64, Vec<u8>>> = per_lane(&req, HashMap::new());
    loop {
        let mut asked = per_lane(&req, 0u64);
        for lane in active(&req) {
            let i = lane as usize;
            while let Some(pointer) = pending[i].pop() {
                if !strings[i].contains_key(&pointer) {
                    asked[i] = pointer;
                    break;
                }
            }
        }
        if asked.iter().all(|&pointer| pointer == 0) {
            break;
        }
        req.send(|lane, p| {
            p.set_word(0, 0);
            p.set_word(1, asked[lane as usize]);
        })
        .await?;
        let mut fetched = req.recv_n().await?;
        for lane in active(&req) {
            let i = lane as usize;
            if asked[i] == 0 || matches!(lanes[i], Lane::Refused) {
                continue;
            }
            let len = fetched[i].len() as u64;
            if len > budget {
                refusals.lane(
                    lane,
                    format!(
                        "its %s strings go above the request's limit of {} bytes",
                        context.config.limits.printf_string_bytes
                    ),
                );
                lanes[i] = Lane::Refused;
                pending[i].clear();
                strings[i].clear();
                continue;
            }
            budget -= len;
            strings[i].insert(asked[i], std::mem::take(&mut fetched[i]));
        }
    }

    // 6. Format and print in pieces (on an I/O thread if any lane prints to a file or may
    // print much), reply.
    let mut jobs = Vec::new();
    let mut long = false;
    for lane in active(&req) {
        let i = lane as usize;
        let Lane::Parsed(pieces, target) = &mut lanes[i] else {
            continue;
        };
        let fetched = strings[i].values().map(Vec::len).sum();
        long |= output_bound(pieces, fetched) > CHUNK;
        jobs.push((lane, std::mem::replace(target, Target::Stdout)));
    }
    drop(lanes); // The parsed pieces borrow `formats`, which the print call takes.
    let mut touches = super::Touches::streams(jobs.iter().map(|(_, target)| target));
    touches.blocks |= long;
    let printed = super::io(&req, touches, move |context| {
        jobs.into_iter()
            .map(|(lane, target)| {
                let i = lane as usize;
                let strings = &strings[i];
                let fetch = |p| strings.get(&p).cloned();
                let (mut written, mut lost) = (0u64, false);
                let mut sink = |chunk: &[u8]| {
                    // After a failed write nothing more is written: C's printf stops too.
                    if !lost {
                        let n = context.services().write(&target, chunk);
                        written += n as u64;
                        lost = n < chunk.len();
                    }
                };
                let result = parse(&formats[i])
                    .and_then(|pieces| format_to(&pieces, &args[i], packed, &fetch, &mut sink));
                let outcome = match result {
                    Err(error) => Err(error.to_string()),
                    Ok(()) if lost => Ok(None),
                    Ok(()) => Ok(Some(written)),
                };
                (lane, outcome)
            })
            .collect::<Vec<_>>()
    })
    .await?;
    let mut results = per_lane(&req, c_result(-1));
    for (lane, outcome) in printed {
        match outcome {
            Ok(written) => results[lane as usize] = written.unwrap_or(c_result(-1)),
            Err(why) => refusals.lane(lane, why),
        }
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
