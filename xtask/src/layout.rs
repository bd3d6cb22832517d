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
    fn prints_the_protocol_test_vectors() {
        // PROTOCOL section 2, plus each generation's client object size (section 8).
        let vectors = [
            ("v1", 1, 1, "primary=0 secondary=4 header=8 packet=24 total=88 client_object=552"),
            ("v1", 3, 1, "primary=0 secondary=12 header=24 packet=72 total=264 client_object=552"),
            ("v2", 1, 1, "primary=64 secondary=68 header=72 packet=88 total=152 client_object=2096"),
            ("v2", 5, 32, "primary=64 secondary=84 header=104 packet=184 total=10424 client_object=2096"),
            ("v1", 64, 32, "primary=0 secondary=256 header=512 packet=1536 total=132608 client_object=552"),
            ("v1", 4096, 64, "primary=0 secondary=16384 header=32768 packet=98304 total=16875520 client_object=552"),
            ("v1", 4096, 32, "primary=0 secondary=16384 header=32768 packet=98304 total=8486912 client_object=552"),
            ("v2", 64, 32, "primary=64 secondary=320 header=576 packet=1600 total=132672 client_object=2096"),
            ("v2", 16384, 64, "primary=64 secondary=65600 header=131136 packet=393280 total=67502144 client_object=2096"),
            // LLVM 18: the header inside each 64 + 64L-byte packet, at align_up(8N, 64).
            ("v0", 1, 1, "primary=0 secondary=4 header=64 packet=80 total=192 client_object=96 stride=128"),
            ("v0", 3, 1, "primary=0 secondary=12 header=64 packet=80 total=448 client_object=96 stride=128"),
            ("v0", 9, 64, "primary=0 secondary=36 header=128 packet=144 total=37568 client_object=96 stride=4160"),
            ("v0", 512, 64, "primary=0 secondary=2048 header=4096 packet=4112 total=2134016 client_object=96 stride=4160"),
        ];
        for (generation, ports, lanes, want) in vectors {
            let args = format!("--gen {generation} --ports {ports} --lanes {lanes}");
            assert_eq!(layout_line(&args).unwrap(), want, "{args}");
        }
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
