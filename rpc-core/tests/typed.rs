//! Typed calls (`services::typed`, PROTOCOL section 12) through a running `RpcServer`, made by
//! rpc-core's client as LLVM's `rpc::dispatch` makes them: every test function of
//! `--dispatch-tests` on 1, 32 and 64 lanes in both generations LLVM 23's client may speak,
//! the one-owner rule, registration while serving, and the refusals of hostile pointees.
#![cfg(not(loom))]

mod common;

use std::ffi::CStr;
use std::time::{Duration, Instant};

use common::Mailbox;
use rpc_core::protocol::{dispatch, CallArg, ClientPort, Deadline, Generation};
use rpc_core::services::dispatch_tests::{self, opcode, Pair};
use rpc_core::{Limits, Opcode, RpcServer, ServerConfig, ServerError, UserGuard};

/// The stream bound the fixture sets: a larger pointee is drained and refused.
const BOUND: u64 = 4096;

/// A running server with the test functions and one mailbox of `lanes` lanes.
struct Fx {
    mask: u64,
    mailbox: Mailbox,
    deadline: Deadline,
    _user: UserGuard,
    server: RpcServer,
}

impl Fx {
    fn new(generation: Generation, lanes: u32, mask: u64) -> Fx {
        Fx::with_limits(
            generation,
            lanes,
            mask,
            Limits {
                stream_bytes: BOUND,
                ..Limits::default()
            },
        )
    }

    fn with_limits(generation: Generation, lanes: u32, mask: u64, limits: Limits) -> Fx {
        let _ = env_logger::builder().is_test(true).try_init();
        let server = RpcServer::new(ServerConfig {
            name: format!("typed-{generation}-L{lanes}"),
            limits,
            ..ServerConfig::default()
        });
        dispatch_tests::register(&server).unwrap();
        let mailbox = Mailbox::attach_as(&server, generation, 4, lanes);
        let _ = server.start().unwrap();
        Fx {
            mask,
            mailbox,
            deadline: common::hang_guard(),
            _user: server.user(),
            server,
        }
    }

    fn open(&self, opcode: Opcode) -> ClientPort<'_> {
        self.mailbox.open(&self.deadline, opcode, self.mask)
    }

    /// `fill` (test function 7) of each lane's whole span with 1, 2, 3, ...; each lane's
    /// return value.
    fn fill_from_one(&self, outs: &mut [Vec<u8>]) -> Vec<Vec<u8>> {
        let mut args: Vec<_> = outs
            .iter_mut()
            .map(|o| {
                let n = (o.len() / 4) as u32;
                vec![
                    CallArg::Pointer(Some(&mut o[..])),
                    CallArg::value(n),
                    CallArg::value(1u32),
                ]
            })
            .collect();
        self.call(opcode(7), &mut args, 4)
    }

    /// A typed call of the warp; each lane's return value.
    fn call(&self, opcode: Opcode, args: &mut [Vec<CallArg<'_>>], reply: usize) -> Vec<Vec<u8>> {
        let mut port = self.open(opcode);
        dispatch(&mut port, args, reply).unwrap()
    }

    fn lanes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..64).filter(|l| self.mask >> l & 1 == 1)
    }

    /// Waits (a hang guard only) until the server has counted `refused` refusals; checks
    /// it counted no errors.
    fn expect_refused(&self, refused: u64) {
        let start = Instant::now();
        while self.server.stats().refused < refused {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{}",
                self.server.stats()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let stats = self.server.stats();
        assert_eq!(
            (stats.refused, stats.errors, stats.panics),
            (refused, 0, 0),
            "{stats}"
        );
    }
}

/// Each lane's arguments: one pointer, to its buffer.
fn one_pointer_each<B: AsMut<[u8]>>(buffers: &mut [B]) -> Vec<Vec<CallArg<'_>>> {
    buffers
        .iter_mut()
        .map(|b| vec![CallArg::Pointer(Some(b.as_mut()))])
        .collect()
}

fn u64_of(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().unwrap())
}

/// Every lane's arguments from `f(lane)` (64 entries; inactive lanes' are not sent).
fn per_lane<'a>(f: impl FnMut(usize) -> Vec<CallArg<'a>>) -> Vec<Vec<CallArg<'a>>> {
    (0..64).map(f).collect()
}

const SHAPES: [(u32, u64); 3] = [(1, 1), (32, 0x8000_1235), (64, 0x8000_0000_0001_0f01)];

#[test]
fn every_test_function_answers_each_lane_in_both_generations() {
    for generation in [Generation::V1, Generation::V2] {
        for (lanes, mask) in SHAPES {
            let fx = Fx::new(generation, lanes, mask);
            let what = format!("{generation} L={lanes}");

            // add
            let r = fx.call(
                opcode(0),
                &mut per_lane(|l| {
                    vec![
                        CallArg::value((u64::MAX - 3).wrapping_add(l as u64)),
                        CallArg::value(l as u32 * 7),
                    ]
                }),
                8,
            );
            for l in fx.lanes() {
                let want = (u64::MAX - 3).wrapping_add(l as u64 * 8);
                assert_eq!(u64_of(&r[l]), want, "{what} add lane {l}");
            }

            // fma3
            let r = fx.call(
                opcode(1),
                &mut per_lane(|l| {
                    vec![
                        CallArg::value(1.5f64 + l as f64),
                        CallArg::value(-2.25f32),
                        CallArg::value(-(l as i8)),
                    ]
                }),
                8,
            );
            for l in fx.lanes() {
                let want = (1.5 + l as f64) * -2.25 - l as f64;
                assert_eq!(
                    f64::from_le_bytes(r[l][..].try_into().unwrap()),
                    want,
                    "{what} fma3"
                );
            }

            // length: a string per lane, lane 0 NULL, one empty
            let mut texts: Vec<Vec<u8>> = (0..64)
                .map(|l: usize| {
                    let mut t = "x"
                        .repeat(l * 3 + if l == 5 { 100 } else { 0 })
                        .into_bytes();
                    t.push(0);
                    t
                })
                .collect();
            let r = {
                let mut args: Vec<Vec<CallArg<'_>>> = texts
                    .iter_mut()
                    .enumerate()
                    .map(|(l, t)| vec![CallArg::Pointer((l != 0).then_some(&mut t[..]))])
                    .collect();
                fx.call(opcode(2), &mut args, 8)
            };
            for l in fx.lanes() {
                let want = if l == 0 {
                    u64::MAX
                } else {
                    (l * 3 + if l == 5 { 100 } else { 0 }) as u64
                };
                assert_eq!(u64_of(&r[l]), want, "{what} length lane {l}");
            }

            // negate: copied back
            let mut xs: Vec<[u8; 8]> = (0..64)
                .map(|l| (l as i64 * 1000 - 7).to_le_bytes())
                .collect();
            {
                let mut args = one_pointer_each(&mut xs);
                let r = fx.call(opcode(3), &mut args, 1);
                for l in fx.lanes() {
                    assert_eq!(r[l], [0], "{what} negate's void result is one zero byte");
                }
            }
            for l in fx.lanes() {
                assert_eq!(
                    i64::from_le_bytes(xs[l]),
                    -(l as i64 * 1000 - 7),
                    "{what} negate lane {l}"
                );
            }

            // sum: a span of up to 999 elements (within the bound), n one less than the span
            let elements = |l: usize| (l as u32 * 37) % 1000;
            let mut spans: Vec<Vec<u8>> = (0..64)
                .map(|l| {
                    (0..elements(l))
                        .flat_map(|i| (i * 3 + 1).to_le_bytes())
                        .collect()
                })
                .collect();
            let before = spans.clone();
            let r = {
                let mut args: Vec<_> = spans
                    .iter_mut()
                    .enumerate()
                    .map(|(l, s)| {
                        let n = u64::from(elements(l)).saturating_sub(1);
                        vec![
                            CallArg::Pointer((!s.is_empty()).then_some(&mut s[..])),
                            CallArg::value(n),
                        ]
                    })
                    .collect();
                fx.call(opcode(4), &mut args, 8)
            };
            for l in fx.lanes() {
                let n = u64::from(elements(l)).saturating_sub(1);
                let want: u64 = (0..n).map(|i| i * 3 + 1).sum();
                assert_eq!(u64_of(&r[l]), want, "{what} sum lane {l}");
            }
            assert_eq!(spans, before, "a const span comes back as it went");

            // pair_sum: a padded struct by value
            let r = fx.call(
                opcode(5),
                &mut per_lane(|l| {
                    let mut bytes = vec![0xEE; 16];
                    bytes[..4].copy_from_slice(&(l as u32 + 1).to_le_bytes());
                    bytes[8..].copy_from_slice(&(1u64 << 40).to_le_bytes());
                    vec![CallArg::Value(bytes)]
                }),
                8,
            );
            for l in fx.lanes() {
                assert_eq!(
                    u64_of(&r[l]),
                    (1 << 40) + l as u64 + 1,
                    "{what} pair_sum lane {l}"
                );
            }

            // ping: no arguments, one byte each way
            let r = fx.call(opcode(6), &mut per_lane(|_| vec![]), 1);
            for l in fx.lanes() {
                assert_eq!(r[l], [0], "{what} ping");
            }

            // fill: a span filled and copied back
            let mut outs: Vec<Vec<u8>> = (0..64).map(|l| vec![0xAB; 4 * (l % 20)]).collect();
            let r = {
                let mut args: Vec<_> = outs
                    .iter_mut()
                    .enumerate()
                    .map(|(l, o)| {
                        vec![
                            CallArg::Pointer((!o.is_empty()).then_some(&mut o[..])),
                            CallArg::value((l % 20) as u32),
                            CallArg::value(l as u32 * 100),
                        ]
                    })
                    .collect();
                fx.call(opcode(7), &mut args, 4)
            };
            for l in fx.lanes() {
                assert_eq!(r[l], ((l % 20) as u32).to_le_bytes(), "{what} fill result");
                let want: Vec<u8> = (0..(l % 20) as u32)
                    .flat_map(|i| (l as u32 * 100 + i).to_le_bytes())
                    .collect();
                assert_eq!(outs[l], want, "{what} fill lane {l}");
            }

            // A typed call is a script: counted once it ends, which may be after the client
            // has its reply (docs/reliability.md, bug 11).
            assert!(fx
                .server
                .wait_drained(fx.mailbox.id, Duration::from_secs(60)));
            let stats = fx.server.stats();
            assert_eq!(
                (stats.refused, stats.errors, stats.panics),
                (0, 0, 0),
                "{what}: {stats}"
            );
            for n in 0..8 {
                assert_eq!(
                    stats.served_of(opcode(n)),
                    1,
                    "{what}: {}",
                    dispatch_tests::NAMES[n as usize]
                );
            }
        }
    }
}

#[test]
fn an_opcode_has_one_owner() {
    let fx = Fx::new(Generation::V1, 1, 1);
    let taken = fx.server.register_typed(opcode(0), |a: u64| a);
    assert!(
        matches!(taken, Err(ServerError::OpcodeTaken { opcode: o, .. }) if o == opcode(0)),
        "{taken:?}"
    );
    fx.server.register_packet(Opcode::user(1), |_, _| {});
    assert!(
        fx.server.register_typed(Opcode::user(1), || {}).is_err(),
        "a packet handler owns it"
    );
    fx.server
        .register_matching("class v", |op| op.class() == b'v', |_| async { Ok(()) });
    assert!(
        fx.server
            .register_typed(Opcode::new(b'v', 3), || {})
            .is_err(),
        "a predicate owns it"
    );
    assert!(
        fx.server.register_typed(Opcode::NOOP, || {}).is_err(),
        "libc's class is the services'"
    );
    // The first owner still answers.
    let r = fx.call(
        opcode(0),
        &mut per_lane(|_| vec![CallArg::value(1u64), CallArg::value(2u32)]),
        8,
    );
    assert_eq!(u64_of(&r[0]), 3);
}

#[test]
fn a_function_registered_while_the_server_runs_is_served() {
    let fx = Fx::new(Generation::V2, 32, 0xF0F0);
    assert!(fx.server.is_running());
    let op = Opcode::user(40);
    fx.server
        .register_typed(op, |s: &CStr, p: Pair, scale: u8| -> u64 {
            (s.to_bytes().len() as u64 + u64::from(p.a) + p.b) * u64::from(scale)
        })
        .unwrap();
    let mut texts: Vec<Vec<u8>> = (0..64)
        .map(|l| format!("lane {l}\0").into_bytes())
        .collect();
    let mut args: Vec<_> = texts
        .iter_mut()
        .enumerate()
        .map(|(l, t)| {
            vec![
                CallArg::Pointer(Some(&mut t[..])),
                CallArg::Value(
                    [&(l as u32).to_le_bytes()[..], &[0; 4], &5u64.to_le_bytes()].concat(),
                ),
                CallArg::value(3u8),
            ]
        })
        .collect();
    let r = fx.call(op, &mut args, 8);
    for l in fx.lanes() {
        let want = (format!("lane {l}").len() as u64 + l as u64 + 5) * 3;
        assert_eq!(u64_of(&r[l]), want, "lane {l}");
    }
}

/// Lanes 0, 4, 5 of a warp of 32 (mask 0x31): hostile pointees on lane 4, honest ones on
/// lanes 0 and 5, which are served as usual.
const HOSTILE: (u32, u64) = (32, 0x31);

/// [`HOSTILE`]'s lane 4 refused (a result of as many zero bytes as the others') while lanes 0
/// and 5 answered `lane_0` and `lane_5`; one more refusal counted.
fn expect_lane_4_refused(fx: &Fx, refusals: &mut u64, r: &[Vec<u8>], lane_0: &[u8], lane_5: &[u8]) {
    let zeros = vec![0u8; lane_0.len()];
    assert_eq!(
        (&r[0][..], &r[4][..], &r[5][..]),
        (lane_0, &zeros[..], lane_5)
    );
    *refusals += 1;
    fx.expect_refused(*refusals);
}

#[test]
fn pointees_that_do_not_fit_their_type_are_refused_and_the_rest_served() {
    let fx = Fx::new(Generation::V1, HOSTILE.0, HOSTILE.1);
    let mut refusals = 0;

    // negate: 7 bytes for an i64.
    let mut xs: Vec<Vec<u8>> = (0..64)
        .map(|l| {
            if l == 4 {
                vec![1; 7]
            } else {
                5i64.to_le_bytes().to_vec()
            }
        })
        .collect();
    let mut args = one_pointer_each(&mut xs);
    let r = fx.call(opcode(3), &mut args, 1);
    assert_eq!((r[0].as_slice(), r[4].as_slice()), (&[0u8][..], &[0u8][..]));
    assert_eq!(xs[4], [1; 7], "nothing copied back to a refused lane");
    assert_eq!(xs[0], (-5i64).to_le_bytes());
    assert_eq!(xs[5], (-5i64).to_le_bytes());
    refusals += 1;
    fx.expect_refused(refusals);

    // sum: a span of 6 bytes for u32 elements.
    let mut spans: Vec<Vec<u8>> = (0..64)
        .map(|l| {
            if l == 4 {
                vec![1; 6]
            } else {
                [7u32, 8].iter().flat_map(|x| x.to_le_bytes()).collect()
            }
        })
        .collect();
    let mut args: Vec<_> = spans
        .iter_mut()
        .map(|s| vec![CallArg::Pointer(Some(&mut s[..])), CallArg::value(2u64)])
        .collect();
    let r = fx.call(opcode(4), &mut args, 8);
    let fifteen = 15u64.to_le_bytes();
    expect_lane_4_refused(&fx, &mut refusals, &r, &fifteen, &fifteen);

    // length: a C string without its NUL.
    let mut texts: Vec<Vec<u8>> = (0..64)
        .map(|l| {
            if l == 4 {
                b"no nul".to_vec()
            } else {
                b"nul\0".to_vec()
            }
        })
        .collect();
    let mut args = one_pointer_each(&mut texts);
    let r = fx.call(opcode(2), &mut args, 8);
    let three = 3u64.to_le_bytes();
    expect_lane_4_refused(&fx, &mut refusals, &r, &three, &three);

    // A function that needs data gets NULL.
    let op = Opcode::user(41);
    fx.server
        .register_typed(op, |s: &CStr| s.to_bytes().len() as u32 + 1)
        .unwrap();
    let mut texts: Vec<Vec<u8>> = (0..64).map(|_| b"ab\0".to_vec()).collect();
    let mut args: Vec<_> = texts
        .iter_mut()
        .enumerate()
        .map(|(l, t)| vec![CallArg::Pointer((l != 4).then_some(&mut t[..]))])
        .collect();
    let r = fx.call(op, &mut args, 4);
    let three = 3u32.to_le_bytes();
    expect_lane_4_refused(&fx, &mut refusals, &r, &three, &three);

    // A function that panics on one lane.
    let op = Opcode::user(42);
    fx.server
        .register_typed(op, |x: u32| -> u32 {
            assert!(x != 4, "lane 4 is cursed");
            x * 2
        })
        .unwrap();
    let r = fx.call(op, &mut per_lane(|l| vec![CallArg::value(l as u32)]), 4);
    let (zero, ten) = (0u32.to_le_bytes(), 10u32.to_le_bytes());
    expect_lane_4_refused(&fx, &mut refusals, &r, &zero, &ten);
}

#[test]
fn an_oversized_pointee_is_drained_not_held_and_the_port_serves_again() {
    for (lanes, mask) in [(1, 1), HOSTILE] {
        let fx = Fx::new(Generation::V2, lanes, mask);
        let hostile = if lanes == 1 { 0 } else { 4 };
        // 64 KiB on the hostile lane, 16 times the stream bound; 4 KiB, the bound, elsewhere.
        let mut spans: Vec<Vec<u8>> = (0..64)
            .map(|l| vec![1u8; if l == hostile { 64 << 10 } else { 4096 }])
            .collect();
        let before = spans.clone();
        let mut args: Vec<_> = spans
            .iter_mut()
            .map(|s| vec![CallArg::Pointer(Some(&mut s[..])), CallArg::value(u64::MAX)])
            .collect();
        let r = fx.call(opcode(4), &mut args, 8);
        assert_eq!(u64_of(&r[hostile]), 0);
        assert_eq!(spans[hostile], before[hostile]);
        for l in fx.lanes().filter(|&l| l != hostile) {
            assert_eq!(u64_of(&r[l]), 1024 * 0x0101_0101, "lane {l}");
        }
        fx.expect_refused(1);
        // The exchange completed: the same port serves the next call.
        let r = fx.call(
            opcode(0),
            &mut per_lane(|_| vec![CallArg::value(1u64), CallArg::value(1u32)]),
            8,
        );
        assert_eq!(u64_of(&r[hostile]), 2);
        fx.expect_refused(1);
    }
}

#[test]
fn pointees_above_the_request_budget_are_refused() {
    let fx = Fx::with_limits(
        Generation::V1,
        HOSTILE.0,
        HOSTILE.1,
        Limits {
            request_bytes: 2048 + 1024,
            ..Limits::default()
        },
    );
    // Lanes 0 and 4 fit (1 KiB each); lane 5's 2 KiB would go over the budget.
    let mut outs: Vec<Vec<u8>> = (0..64)
        .map(|l| vec![0; if l == 5 { 2048 } else { 1024 }])
        .collect();
    let r = fx.fill_from_one(&mut outs);
    assert_eq!(
        (&r[0][..], &r[4][..], &r[5][..]),
        (
            &256u32.to_le_bytes()[..],
            &256u32.to_le_bytes()[..],
            &[0u8; 4][..]
        )
    );
    assert_eq!(
        outs[5],
        vec![0; 2048],
        "nothing copied back to the refused lane"
    );
    assert_eq!(&outs[4][..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
    fx.expect_refused(1);
}

/// Pointees longer than their first packet are charged to the server's memory budget
/// (`Limits::held_bytes`) before they grow: a lane the budget has no room for is refused and
/// drained like an oversized one, and nothing stays charged once the call ends.
#[test]
fn pointees_beyond_the_memory_budget_are_refused() {
    let fx = Fx::with_limits(
        Generation::V1,
        HOSTILE.0,
        HOSTILE.1,
        Limits {
            held_bytes: 1024,
            ..Limits::default()
        },
    );
    // 1 KiB each: lane 0's fits the budget, lane 4's (and 5's) would pass it.
    let mut outs: Vec<Vec<u8>> = (0..64).map(|_| vec![0; 1024]).collect();
    let r = fx.fill_from_one(&mut outs);
    assert_eq!(
        (&r[0][..], &r[4][..], &r[5][..]),
        (&256u32.to_le_bytes()[..], &[0u8; 4][..], &[0u8; 4][..])
    );
    assert_eq!(&outs[0][..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
    assert_eq!(
        outs[4],
        vec![0; 1024],
        "nothing copied back to a refused lane"
    );
    fx.expect_refused(1);
    assert_eq!(
        fx.server.context().held_bytes(),
        0,
        "the charge went with the call"
    );
}

#[test]
fn a_packed_pointer_other_than_the_hosts_is_refused() {
    let fx = Fx::new(Generation::V1, HOSTILE.0, HOSTILE.1);
    // negate by hand: the pointee, the host's pointer, then packed arguments in which lane 4
    // names an address of its own choosing.
    let mut port = fx.open(opcode(3));
    let x = 9i64.to_le_bytes();
    port.send_n(&[&x[..]; 64]).unwrap();
    let mut hosts = [0u64; 64];
    port.recv(|l, p| hosts[l as usize] = p.word(0)).unwrap();
    assert!(hosts[0] != 0 && hosts[0] != hosts[5], "{hosts:x?}");
    port.send(|l, p| {
        p.set_word(
            0,
            if l == 4 {
                0x7fff_0000_1000
            } else {
                hosts[l as usize]
            },
        )
    })
    .unwrap();
    let back = port.recv_n(8).unwrap();
    let mut void = [0u64; 64];
    port.recv(|l, p| void[l as usize] = p.word(0) & 0xFF)
        .unwrap();
    drop(port);
    assert_eq!(back[0], (-9i64).to_le_bytes());
    assert_eq!(back[5], (-9i64).to_le_bytes());
    assert!(
        back[4].is_empty(),
        "nothing copied back to the refused lane"
    );
    fx.expect_refused(1);
}

#[test]
fn a_client_whose_argument_kinds_differ_desynchronises_without_a_hang_or_a_crash() {
    let fx = Fx::new(Generation::V1, HOSTILE.0, HOSTILE.1);
    // `add` takes two values; this client passes one pointer (as for `negate`). The server
    // reads the pointee's first packet as the packed arguments and answers; the client reads
    // that answer as the host pointer and sends its arguments, which the server takes for a
    // new request; the client then reads that one's answer as its copy-back length and gives
    // up (longer than its pointee). Both sides end; neither waits for ever.
    let mut xs: Vec<Vec<u8>> = (0..64).map(|_| 5i64.to_le_bytes().to_vec()).collect();
    let mut args = one_pointer_each(&mut xs);
    let mut port = fx.open(opcode(0));
    assert!(dispatch(&mut port, &mut args, 1).is_err());
    drop(port);
    // The server goes on serving, that port included.
    for _ in 0..8 {
        let r = fx.call(
            opcode(0),
            &mut per_lane(|_| vec![CallArg::value(40u64), CallArg::value(2u32)]),
            8,
        );
        assert_eq!(u64_of(&r[5]), 42);
    }
    let stats = fx.server.stats();
    assert_eq!((stats.errors, stats.panics), (0, 0), "{stats}");
}
