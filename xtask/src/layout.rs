//! `cargo xtask layout --gen v0|v1|v2 --ports N --lanes L`: one line with the mailbox's offsets
//! and sizes in bytes, from [`rpc_core::protocol::Layout`] (PROTOCOL section 2). For v0 (LLVM
//! 18), `header` and `packet` are port 0's header and lane 0 buffer, inside its packet, and
//! `stride` the bytes from one port's packet to the next.

use rpc_core::protocol::{Generation, Layout};

use crate::flags::{generation, number};
use crate::{Failure, Result};

/// `cargo xtask layout`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The mailbox generation (v0: LLVM 18, v1: LLVM 19-22, v2: LLVM 23+)
    #[arg(long = "gen", value_name = "GEN", value_parser = generation())]
    generation: Generation,
    /// Ports (the generation says how many it takes)
    #[arg(long, value_name = "N", value_parser = number(0, u32::MAX), allow_negative_numbers = true)]
    ports: u32,
    /// Lanes per port: 32 or 64
    #[arg(long, value_name = "L", value_parser = number(0, u32::MAX), allow_negative_numbers = true)]
    lanes: u32,
}

pub fn run(args: &Args) -> Result {
    println!("{}", line(&layout(args)?));
    Ok(())
}

/// The layout the flags name, or a usage error for a shape `Layout::new` rejects (the
/// flags' ranges only keep the counts in u32).
fn layout(args: &Args) -> Result<Layout> {
    Layout::new(args.generation, args.ports, args.lanes)
        .map_err(|e| Failure::Usage(format!("layout: {e}")))
}

/// `primary=.. secondary=.. header=.. packet=.. total=.. client_object=..` (v0: `stride=..`)
fn line(layout: &Layout) -> String {
    let stride = match layout.generation() {
        Generation::V0 => format!(" stride={}", layout.packet_stride()),
        Generation::V1 | Generation::V2 => String::new(),
    };
    format!(
        "primary={} secondary={} header={} packet={} total={} client_object={}{stride}",
        layout.primary(),
        layout.secondary(),
        layout.header(),
        layout.packet(),
        layout.total_size(),
        layout.client_object_size()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout_line(args: &str) -> Result<String> {
        match crate::tests::parse(&format!("layout {args}"))? {
            crate::Command::Layout(args) => layout(&args).map(|l| line(&l)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn prints_the_test_vectors_of_the_protocol_document() {
        // PROTOCOL section 2's tables, read from the document itself so that it and the code
        // cannot drift apart; each generation's client object size is section 8's.
        let protocol = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROTOCOL.md"));
        let mut checked = 0;
        for row in protocol.lines().filter(|l| l.starts_with("| v")) {
            let cells: Vec<&str> = row
                .split('|')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect();
            let ["v0" | "v1" | "v2", ..] = cells[..] else {
                continue; // section 1's table of generations
            };
            let [generation, ports, lanes, primary, secondary, header, packet, total] = cells[..]
            else {
                panic!("a test vector of eight cells: {row}");
            };
            let (client_object, stride) = match generation {
                "v0" => (
                    96,
                    format!(" stride={}", 64 + 64 * lanes.parse::<u64>().unwrap()),
                ),
                "v1" => (552, String::new()),
                _ => (2096, String::new()),
            };
            let args = format!("--gen {generation} --ports {ports} --lanes {lanes}");
            let want = format!(
                "primary={primary} secondary={secondary} header={header} packet={packet} \
                 total={total} client_object={client_object}{stride}"
            );
            assert_eq!(layout_line(&args).unwrap(), want, "{args}");
            checked += 1;
        }
        assert_eq!(checked, 14, "PROTOCOL section 2's 9 + 5 test vectors");
    }

    #[test]
    fn flags_in_any_order_and_with_equals() {
        assert_eq!(
            layout_line("--lanes=32 --ports 64 --gen=v1").unwrap(),
            layout_line("--gen v1 --ports 64 --lanes 32").unwrap()
        );
    }

    #[test]
    fn invalid_input_is_a_usage_error() {
        for bad in [
            "",
            "--gen v1 --ports 64",
            "--gen v3 --ports 64 --lanes 32",
            "--gen v1 --ports sixty --lanes 32",
            "--gen v1 --ports -1 --lanes 32",
            "--gen v1 --ports 0 --lanes 32",
            "--gen v1 --ports 4097 --lanes 32",
            "--gen v2 --ports 16385 --lanes 32",
            "--gen v0 --ports 513 --lanes 32",
            "--gen v1 --ports 64 --lanes 16",
            "--gen v1 --ports 64 --lanes 32 --extra 1",
            "--gen v1 --ports 64 --lanes 32 stray",
        ] {
            assert!(
                matches!(layout_line(bad), Err(Failure::Usage(_))),
                "accepted: {bad:?}"
            );
        }
        let Err(Failure::Usage(why)) = layout_line("--gen v1 --ports 5000 --lanes 32") else {
            panic!("accepted 5000 ports");
        };
        assert!(why.contains("5000"), "{why}");
    }
}
