//! Both sides of the port protocol over a real heap region, with real threads: a client warp per
//! thread against a server thread that runs the test scripts of PROTOCOL section 6.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;

use rpc_core::protocol::{Backoff, Resumable};
use rpc_core::protocol::{
    Client, Generation, Layout, LockTable, MailboxMemory, ServerEnd, ServerPort,
};
use rpc_core::{Opcode, ProtocolError};

/// A mailbox with a client lock table and a server lock table.
struct Fixture {
    memory: MailboxMemory,
    client_locks: LockTable,
    server_locks: LockTable,
}

impl Fixture {
    fn new(generation: Generation, ports: u32, lanes: u32) -> Arc<Self> {
        let layout = Layout::new(generation, ports, lanes).unwrap();
        Arc::new(Fixture {
            memory: MailboxMemory::new(layout),
            client_locks: LockTable::new(ports),
            server_locks: LockTable::new(ports),
        })
    }
    fn client(&self) -> Client<'_> {
        Client::new(self.memory.view(), self.client_locks.words()).unwrap()
    }
    fn server(&self) -> ServerEnd<'_> {
        ServerEnd::new(self.memory.view(), self.server_locks.words()).unwrap()
    }
}

const BOUND: u64 = 64 << 20;

/// `normal`, or `under_miri` when miri runs the test: it interprets every instruction (and
/// checks each access), so loops are cut to a few rounds. The same exchanges, fewer times.
const fn scaled(normal: usize, under_miri: usize) -> usize {
    if cfg!(miri) {
        under_miri
    } else {
        normal
    }
}

/// The test scripts of PROTOCOL section 6, server side.
fn serve_test_opcode(port: &mut ServerPort<'_>) -> Result<(), ProtocolError> {
    match port.opcode() {
        Opcode::TEST_INCREMENT => port.recv_and_send(|_, p| p.set_word(0, p.word(0) + 1)),
        Opcode::TEST_STREAM => {
            let data = port.recv_n(BOUND)?;
            let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            port.send_n(&slices)
        }
        Opcode::TEST_INTERFACE => {
            let mut end_with_recv = [false; 64];
            let mut cnt = [0u64; 64];
            port.recv(|l, p| end_with_recv[l as usize] = p.word(0) != 0)?;
            port.recv(|l, p| cnt[l as usize] = p.word(0))?;
            let send = |port: &mut ServerPort<'_>, cnt: &mut [u64; 64]| {
                port.send(|l, p| {
                    cnt[l as usize] += 1;
                    p.set_word(0, cnt[l as usize]);
                })
            };
            let recv = |port: &mut ServerPort<'_>, cnt: &mut [u64; 64]| {
                port.recv(|l, p| cnt[l as usize] = p.word(0))
            };
            send(port, &mut cnt)?;
            recv(port, &mut cnt)?;
            send(port, &mut cnt)?;
            recv(port, &mut cnt)?;
            recv(port, &mut cnt)?;
            send(port, &mut cnt)?;
            send(port, &mut cnt)?;
            let first = port.first_lane() as usize;
            if end_with_recv[first] {
                recv(port, &mut cnt)
            } else {
                send(port, &mut cnt)
            }
        }
        _ => Ok(()), // NOOP and unknown opcodes: close without reading.
    }
}

/// Runs a server thread over `fixture` until `stop`; returns the number of ports served.
fn spawn_server(fixture: Arc<Fixture>, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let server = fixture.server();
        let mut served = 0;
        let mut idle = 0;
        while !stop.load(Ordering::Relaxed) {
            let mut from = 0;
            let mut any = false;
            while let Some(mut port) = server.open_next(from, &Backoff) {
                from = port.index() + 1;
                port.check_mask().unwrap();
                serve_test_opcode(&mut port).unwrap();
                served += 1;
                any = true;
            }
            idle = if any { 0 } else { idle + 1 };
            Backoff::step(idle);
        }
        served
    })
}

fn with_server<R>(fixture: &Arc<Fixture>, body: impl FnOnce() -> R) -> (R, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let handle = spawn_server(fixture.clone(), stop.clone());
    let result = body();
    stop.store(true, Ordering::Relaxed);
    (result, handle.join().unwrap())
}

fn increment(client: &Client<'_>, mask: u64, base: u64) -> Vec<u64> {
    let mut port = client.open(Opcode::TEST_INCREMENT, mask).unwrap();
    let mut out = vec![0; 64];
    port.send_and_recv(
        |l, p| p.set_word(0, base + u64::from(l)),
        |l, p| out[l as usize] = p.word(0),
    )
    .unwrap();
    out
}

#[test]
fn increment_for_every_lane_size_and_partial_masks() {
    for generation in Generation::ALL {
        for (lanes, masks) in [
            (1u32, vec![1u64]),
            (32, vec![0xFFFF_FFFF, 0x1, 0x8000_0001, 0x0F0F_0000]),
            (
                64,
                vec![u64::MAX, 0x8000_0000_0000_0000, 0xAAAA_AAAA_AAAA_AAAA],
            ),
        ] {
            let fixture = Fixture::new(generation, 8, lanes);
            let (_, served) = with_server(&fixture, || {
                let client = fixture.client();
                for &mask in &masks {
                    let out = increment(&client, mask, 1000);
                    for lane in 0..64 {
                        let expect = if mask >> lane & 1 == 1 {
                            1001 + lane
                        } else {
                            0
                        };
                        assert_eq!(
                            out[lane as usize], expect,
                            "{generation} L={lanes} mask={mask:#x}"
                        );
                    }
                }
            });
            assert_eq!(served, masks.len() as u64);
        }
    }
}

fn interface(client: &Client<'_>, mask: u64, end_with_recv: bool) {
    let mut port = client.open(Opcode::TEST_INTERFACE, mask).unwrap();
    let mut cnt = [0u64; 64];
    port.send(|_, p| p.set_word(0, end_with_recv as u64))
        .unwrap();
    port.send(|l, p| p.set_word(0, cnt[l as usize])).unwrap();
    // Mirror of the server: recv, send, recv, send, send, recv, recv, then send or recv.
    let check = |cnt: &mut [u64; 64], l: u32, got: u64| {
        assert_eq!(got, cnt[l as usize] + 1, "lane {l}");
        cnt[l as usize] = got;
    };
    port.recv(|l, p| check(&mut cnt, l, p.word(0))).unwrap();
    port.send(|l, p| {
        cnt[l as usize] += 1;
        p.set_word(0, cnt[l as usize])
    })
    .unwrap();
    port.recv(|l, p| check(&mut cnt, l, p.word(0))).unwrap();
    port.send(|l, p| {
        cnt[l as usize] += 1;
        p.set_word(0, cnt[l as usize])
    })
    .unwrap();
    port.send(|l, p| {
        cnt[l as usize] += 1;
        p.set_word(0, cnt[l as usize])
    })
    .unwrap();
    port.recv(|l, p| check(&mut cnt, l, p.word(0))).unwrap();
    port.recv(|l, p| check(&mut cnt, l, p.word(0))).unwrap();
    if end_with_recv {
        port.send(|l, p| {
            cnt[l as usize] += 1;
            p.set_word(0, cnt[l as usize])
        })
        .unwrap();
    } else {
        port.recv(|l, p| check(&mut cnt, l, p.word(0))).unwrap();
    }
    for lane in rpc_core::protocol::lanes(mask) {
        assert_eq!(cnt[lane as usize], 8, "every step counted once");
    }
}

#[test]
fn every_send_recv_adjacency_both_ways() {
    for (generation, lanes) in [
        (Generation::V1, 1),
        (Generation::V1, 32),
        (Generation::V1, 64),
    ]
    .into_iter()
    .chain([(Generation::V0, 1), (Generation::V0, 64)])
    {
        let fixture = Fixture::new(generation, 4, lanes);
        let mask = if lanes == 1 { 1 } else { 0b1011 };
        let (_, served) = with_server(&fixture, || {
            let client = fixture.client();
            for _ in 0..scaled(20, 2) {
                interface(&client, mask, true);
                interface(&client, mask, false);
            }
            // The port is back in the client-owns state: a plain round trip still works.
            assert_eq!(
                increment(&client, mask, 1)[0],
                if mask & 1 == 1 { 2 } else { 0 }
            );
        });
        assert_eq!(served, 2 * scaled(20, 2) as u64 + 1);
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn stream(client: &Client<'_>, mask: u64, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut port = client.open(Opcode::TEST_STREAM, mask).unwrap();
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    port.send_n(&slices).unwrap();
    port.recv_n(BOUND).unwrap()
}

#[test]
fn send_n_recv_n_lengths_around_packet_edges() {
    let longest = scaled(1 << 20, 300);
    let lengths = [
        0usize,
        1,
        55,
        56,
        57,
        64,
        119,
        120,
        121,
        4096.min(longest),
        longest,
    ];
    for (generation, lanes) in [
        (Generation::V2, 1u32),
        (Generation::V2, 32),
        (Generation::V0, 1),
        (Generation::V0, 32),
    ] {
        let fixture = Fixture::new(generation, 4, lanes);
        with_server(&fixture, || {
            let client = fixture.client();
            for &len in &lengths {
                let data = vec![pattern(len, 7)];
                let got = stream(&client, 1, &data);
                assert_eq!(got[0], data[0], "{generation} L={lanes} len={len}");
            }
            if lanes == 32 {
                // Lanes of different lengths in one warp, lane 3 inactive.
                let data: Vec<Vec<u8>> = (0..32)
                    .map(|l| pattern(lengths[l % lengths.len()].min(scaled(5000, 121)), l as u8))
                    .collect();
                let mask = !(1u64 << 3) & 0xFFFF_FFFF;
                let got = stream(&client, mask, &data);
                for lane in 0..32 {
                    let expect: &[u8] = if lane == 3 { &[] } else { &data[lane] };
                    assert_eq!(got[lane], expect, "lane {lane}");
                }
            }
        });
    }
}

#[test]
fn fixed_size_objects() {
    let fixture = Fixture::new(Generation::V1, 2, 32);
    let mask = 0b110;
    let memory = fixture.memory.view();
    let client = Client::new(memory, fixture.client_locks.words()).unwrap();
    let server = fixture.server();
    let objects: Vec<Vec<u8>> = (0..32).map(|l| pattern(150, l)).collect();
    let slices: Vec<&[u8]> = objects.iter().map(Vec::as_slice).collect();
    thread::scope(|s| {
        s.spawn(|| {
            let mut port = client.open(Opcode::user(1), mask).unwrap();
            port.send_fixed(150, &slices).unwrap();
        });
        let mut port = loop {
            if let Some(port) = server.open_next(0, &Backoff) {
                break port;
            }
            thread::yield_now();
        };
        let got = port.recv_fixed(150).unwrap();
        assert_eq!(got[1], objects[1]);
        assert_eq!(got[2], objects[2]);
        assert!(got[0].is_empty());
    });
    assert!(matches!(
        client
            .open(Opcode::user(1), 1)
            .unwrap()
            .send_fixed(10, &[&[0; 9]]),
        Err(ProtocolError::BadLength {
            lane: 0,
            len: 9,
            expected: 10
        })
    ));
}

#[test]
fn many_clients_contending_for_few_ports() {
    const THREADS: usize = scaled(8, 4);
    const ROUNDS: u64 = scaled(300, 5) as u64;
    let fixture = Fixture::new(Generation::V1, 3, 1);
    let in_use: Arc<Vec<AtomicU32>> = Arc::new((0..3).map(|_| AtomicU32::new(0)).collect());
    let (_, served) = with_server(&fixture, || {
        thread::scope(|s| {
            for t in 0..THREADS as u64 {
                let (fixture, in_use) = (&fixture, &in_use);
                s.spawn(move || {
                    let client = fixture.client();
                    for r in 0..ROUNDS {
                        let mut port = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
                        let i = port.index() as usize;
                        assert_eq!(
                            in_use[i].fetch_add(1, Ordering::SeqCst),
                            0,
                            "port {i} opened twice"
                        );
                        let x = t << 32 | r;
                        let mut got = 0;
                        port.send_and_recv(|_, p| p.set_word(0, x), |_, p| got = p.word(0))
                            .unwrap();
                        assert_eq!(got, x + 1);
                        in_use[i].fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
    });
    assert_eq!(served, THREADS as u64 * ROUNDS);
}

#[test]
fn two_server_threads_share_one_lock_table() {
    let fixture = Fixture::new(Generation::V1, 4, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let servers: Vec<_> = (0..2)
        .map(|_| spawn_server(fixture.clone(), stop.clone()))
        .collect();
    let rounds = scaled(300, 5) as u64;
    thread::scope(|s| {
        for t in 0..4u64 {
            let fixture = &fixture;
            s.spawn(move || {
                let client = fixture.client();
                for r in 0..rounds {
                    assert_eq!(increment(&client, 1, t * 1000 + r)[0], t * 1000 + r + 1);
                }
            });
        }
    });
    stop.store(true, Ordering::Relaxed);
    let served: u64 = servers.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(served, 4 * rounds, "every request served exactly once");
}

/// Writes a port's client-side state by hand, as a misbehaving device would.
fn raw_request(fixture: &Fixture, port: usize, mask: u64, opcode: u32, secondary: u32) {
    let view = fixture.memory.view();
    let base = fixture.memory.as_ptr();
    let layout = view.layout();
    // SAFETY: offsets inside the owned region; every access to it is atomic.
    unsafe {
        let header =
            &*(base.add(layout.header_of(port as u32)) as *const std::sync::atomic::AtomicU64);
        header.store(mask, Ordering::Relaxed);
        let opc =
            &*(base.add(layout.header_of(port as u32) + 8) as *const std::sync::atomic::AtomicU64);
        opc.store(u64::from(opcode), Ordering::Relaxed);
        let c = &*(base.add(layout.secondary() + 4 * port) as *const AtomicU32);
        std::sync::atomic::fence(Ordering::Release);
        c.store(secondary, Ordering::Relaxed);
    }
}

/// The `u64` at byte `offset` of the fixture's region.
fn word_at(fixture: &Fixture, offset: usize) -> &std::sync::atomic::AtomicU64 {
    assert!(offset % 8 == 0 && offset + 8 <= fixture.memory.layout().total_size());
    // SAFETY: an aligned word inside the owned region, which outlives the borrow of `fixture`;
    // every access to it is an atomic of this size.
    unsafe { &*(fixture.memory.as_ptr().add(offset) as *const std::sync::atomic::AtomicU64) }
}

/// LLVM 18's packet, written by hand where its `rpc.h` puts it: the server finds port 2's
/// header and lane 1's buffer inside port 2's 64 + 64L-byte packet, 64-aligned after the
/// flags, and answers there, touching no other port's packet.
#[test]
fn the_server_reads_and_writes_llvm18_packets_where_llvm18_puts_them() {
    let fixture = Fixture::new(Generation::V0, 3, 32);
    let layout = fixture.memory.layout();
    assert_eq!(layout.header(), 64);
    assert_eq!(layout.header_of(2), 64 + 2 * (64 + 64 * 32));
    let buffer = |port: u32, lane: u32| word_at(&fixture, layout.packet_of(port, lane));
    for port in 0..3 {
        buffer(port, 1).store(41 + u64::from(port), Ordering::Relaxed);
    }
    let (_, served) = with_server(&fixture, || {
        // Lane 1 only; the opcode in the low 16 bits of the header's second word would be
        // LLVM 18's number, here the table's own (this mailbox numbers as `Current`).
        raw_request(&fixture, 2, 0b10, Opcode::TEST_INCREMENT.0, 1);
        while primary_word(&fixture, 2) != 1 {
            std::thread::yield_now();
        }
    });
    assert_eq!(served, 1);
    assert_eq!(
        buffer(2, 1).load(Ordering::Relaxed),
        44,
        "port 2, lane 1 incremented"
    );
    assert_eq!(buffer(1, 1).load(Ordering::Relaxed), 42, "port 1 untouched");
    assert_eq!(buffer(0, 1).load(Ordering::Relaxed), 41, "port 0 untouched");
}

fn primary_word(fixture: &Fixture, port: usize) -> u32 {
    let layout = fixture.memory.layout();
    // SAFETY: inside the owned region; atomic access.
    unsafe {
        (*(fixture.memory.as_ptr().add(layout.primary() + 4 * port) as *const AtomicU32))
            .load(Ordering::Relaxed)
    }
}

#[test]
fn mailbox_words_other_than_zero_and_one_count_as_one() {
    let fixture = Fixture::new(Generation::V1, 4, 1);
    let server = fixture.server();
    raw_request(&fixture, 2, 1, Opcode::NOOP.0, 0xDEAD_BEEF);
    assert_eq!(server.next_pending(0), Some(2));
    let port = server.try_open(2, &Backoff).expect("pending");
    assert_eq!(port.opcode(), Opcode::NOOP);
    drop(port); // The server owned the buffer: close flips its word to 1 == normalised client word.
    assert_eq!(primary_word(&fixture, 2), 1);
    assert_eq!(
        server.next_pending(0),
        None,
        "the garbage word now reads as answered"
    );
}

#[test]
fn header_masks_with_bits_at_or_above_l_are_errors() {
    for (lanes, mask) in [(1u32, 0b10u64), (32, 1 << 32 | 1), (32, 0)] {
        let fixture = Fixture::new(Generation::V1, 1, lanes);
        raw_request(&fixture, 0, mask, Opcode::TEST_INCREMENT.0, 1);
        let server = fixture.server();
        let port = server.try_open(0, &Backoff).unwrap();
        assert_eq!(
            port.check_mask(),
            Err(ProtocolError::BadMask { mask, lanes })
        );
        assert_eq!(
            port.mask(),
            mask & Layout::new(Generation::V1, 1, lanes).unwrap().lane_mask()
        );
        drop(port);
        assert_eq!(
            server.next_pending(0),
            None,
            "closing returns the port to the client"
        );
    }
    // A client cannot open with such masks either.
    let fixture = Fixture::new(Generation::V1, 1, 32);
    assert!(matches!(
        fixture.client().open(Opcode::NOOP, 1 << 40),
        Err(ProtocolError::BadMask { .. })
    ));
}

#[test]
fn send_n_above_the_bound_is_an_error_and_the_server_goes_on() {
    let fixture = Fixture::new(Generation::V1, 2, 1);
    let server = fixture.server();
    // A lane claiming 2^63 bytes.
    let view = fixture.memory.view();
    let client = Client::new(view, fixture.client_locks.words()).unwrap();
    let mut port = client.open(Opcode::TEST_STREAM, 1).unwrap();
    port.send(|_, p| p.set_word(0, 1 << 63)).unwrap();
    let mut sport = server.try_open(port.index(), &Backoff).unwrap();
    assert_eq!(
        sport.recv_n(BOUND),
        Err(ProtocolError::TooLong {
            lane: 0,
            len: 1 << 63,
            bound: BOUND
        })
    );
    drop(sport);
    drop(port);
    assert_eq!(server.next_pending(0), None);
    // And a well-formed request afterwards is served.
    let fixture2 = fixture.clone();
    let (_, served) = with_server(&fixture2, || {
        assert_eq!(increment(&fixture2.client(), 1, 41)[0], 42)
    });
    assert_eq!(served, 1);
}

#[test]
fn a_wait_can_give_up() {
    struct GiveUp;
    impl rpc_core::protocol::Wait for GiveUp {
        fn pause(&self, port: u32, attempt: u32) -> Result<(), ProtocolError> {
            if attempt > 100 {
                return Err(ProtocolError::Abandoned {
                    port,
                    reason: "test",
                });
            }
            thread::yield_now();
            Ok(())
        }
    }
    let fixture = Fixture::new(Generation::V1, 1, 1);
    let client = fixture.client();
    let mut port = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
    port.send(|_, p| p.set_word(0, 1)).unwrap();
    let server = fixture.server();
    let mut sport = server.try_open(0, &GiveUp).unwrap();
    sport.recv(|_, _| {}).unwrap();
    sport.send(|_, p| p.set_word(0, 2)).unwrap();
    // The client never answers this recv's acknowledgement: the next recv gives up.
    assert!(matches!(
        sport.recv(|_, _| {}),
        Err(ProtocolError::Abandoned { port: 0, .. })
    ));
    sport.reset();
    let mut got = 0;
    port.recv(|_, p| got = p.word(0)).unwrap();
    assert_eq!(got, 2);
    drop(port);
    assert_eq!(
        server.next_pending(0),
        None,
        "reset left the port with the client"
    );
}

/// A wait that gives up at once.
struct GiveUp;

impl rpc_core::protocol::Wait for GiveUp {
    fn pause(&self, port: u32, _attempt: u32) -> Result<(), ProtocolError> {
        Err(ProtocolError::Abandoned {
            port,
            reason: "test gives up",
        })
    }
}

/// Regression: a client whose wait gave up mid-exchange released its port lock on drop, so the
/// next request of the same client (lock table) could take the port while the server was still
/// inside the old exchange, and have its packets read as the old script's (seen as a wrong
/// TEST_INCREMENT answer across a forced server shutdown). Like a client that panics, it now
/// keeps the lock.
#[test]
fn a_client_whose_wait_gave_up_keeps_its_port_locked() {
    let fixture = Fixture::new(Generation::V1, 2, 1);
    let client = fixture.client().with_wait(&GiveUp);
    let mut port = client.open(Opcode::TEST_STREAM, 1).unwrap();
    assert_eq!(port.index(), 0);
    port.send(|_, p| p.set_word(0, 1000)).unwrap();
    // No server has answered: the next send's wait gives up.
    assert!(port.send(|_, _| {}).is_err());
    drop(port);
    let again = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
    assert_eq!(again.index(), 1, "port 0 stays locked");
    drop(again);
    // A port closed after a complete exchange is unlocked as before.
    assert!(client.try_open_at(1, Opcode::NOOP, 1).unwrap().is_some());
}

/// The same for a client whose `recv_n` refused a length above its bound: it stops reading
/// while the server may go on sending, so it keeps the lock too.
#[test]
fn a_client_whose_recv_n_refused_a_length_keeps_its_port_locked() {
    let fixture = Fixture::new(Generation::V1, 2, 1);
    let client = fixture.client();
    let server = fixture.server();
    let mut port = client.open(Opcode::TEST_STREAM, 1).unwrap();
    port.send_n(&[&[7u8; 50]]).unwrap();
    let mut served = server.try_open(0, &Backoff).unwrap();
    let data = served.recv_n(BOUND).unwrap();
    served.send_n(&[&data[0]]).unwrap();
    drop(served);
    assert!(matches!(
        port.recv_n(10),
        Err(ProtocolError::TooLong { len: 50, .. })
    ));
    drop(port);
    assert_eq!(client.open(Opcode::NOOP, 1).unwrap().index(), 1);
}

/// A resumable client's operations stop at a wait (`WouldBlock`) and are called again later, as
/// the pipelined rows of rpc-bench drive 64 ports from one thread: a retried operation must
/// not repeat what it did before the wait. A recv after a recv first hands the buffer back as
/// an acknowledgement; retried, it must not hand it back twice (which would hand the server's
/// next packet's buffer to the client before it was written).
#[test]
fn a_resumable_recv_after_recv_retried_acknowledges_once() {
    let fixture = Fixture::new(Generation::V1, 4, 1);
    let client = fixture.client().with_wait(&Resumable);
    let server = fixture.server();
    let mut port = client.open(Opcode::TEST_STREAM, 1).unwrap();
    port.send(|_, p| p.set_word(0, 1)).unwrap();
    let mut serving = server.try_open(0, &Resumable).unwrap();
    serving.recv(|_, p| assert_eq!(p.word(0), 1)).unwrap();
    serving.send(|_, p| p.set_word(0, 10)).unwrap();
    port.recv(|_, p| assert_eq!(p.word(0), 10)).unwrap();
    // The server has not sent its second packet: the recv acknowledges and stops, twice.
    for _ in 0..2 {
        assert!(matches!(
            port.recv(|_, _| panic!("no packet yet")),
            Err(ProtocolError::WouldBlock { .. })
        ));
    }
    // The buffer is the server's once, so its send goes through, and the client reads it.
    serving.send(|_, p| p.set_word(0, 20)).unwrap();
    port.recv(|_, p| assert_eq!(p.word(0), 20)).unwrap();
}
