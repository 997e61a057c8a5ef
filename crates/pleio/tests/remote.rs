//! Tables published to Redis: a 3-master, 3-replica cluster and a
//! standalone server on loopback (pleio_testkit::redis, stopped by pid),
//! against the local files they were published from. Every strategy,
//! dtype and rounding gives the local file's bytes; a corrupt bucket, a
//! wrong password, a missing table are typed errors naming what failed;
//! publishing resumes; two tables never mix; a master killed during a
//! gather loop never yields a wrong row. Over TLS (`rediss://`), a server
//! that requires client certificates serves the same bytes and refuses a
//! client without one, an untrusted server or a wrong name.

mod fetch_fixture;

use fetch_fixture::{CkptFixture, Fixture, Rng};
use pleio::{Dtype, ErrorKind, Rounding, Strategy, Table};
use pleio_lab::synth_ckpt::CkptEncoding;
use pleio_testkit::redis::{Cluster, Server, TlsFiles};

fn url(seed: &str, name: &str) -> String {
    format!("redis://{seed}/{name}?timeout_ms=500&retries=6")
}

fn publish(t: &Table, url: &str, bucket_bytes: u64) -> pleio::remote::Published {
    t.publish(url, "test", &opts(bucket_bytes), |_, _| {})
        .unwrap()
}

/// Publishes `t` again to `url` in 16 KiB buckets, one at a time.
fn republish(t: &Table, url: &str, verify: bool) -> pleio::remote::Published {
    let o = pleio::remote::PublishOptions {
        verify,
        in_flight: 1,
        ..opts(1 << 14)
    };
    t.publish(url, "t", &o, |_, _| {}).unwrap()
}

/// `bucket_bytes` buckets, 3 uploading at once.
fn opts(bucket_bytes: u64) -> pleio::remote::PublishOptions {
    pleio::remote::PublishOptions {
        bucket_bytes,
        verify: false,
        in_flight: 3,
        part: None,
    }
}

fn out(t: &Table, d: Dtype, rows: &[u64]) -> Result<Vec<u8>, pleio::Error> {
    let mut v = vec![0u8; t.out_bytes(d, rows.len()).unwrap()];
    t.gather_as(d, rows, &mut v)?;
    Ok(v)
}

/// Random rows with repeats, and the edges.
fn rows_of(rng: &mut Rng, n_rows: u64, n: usize) -> Vec<u64> {
    let mut r: Vec<u64> = (0..n).map(|_| rng.below(n_rows)).collect();
    r.extend([0, 1, n_rows - 1, n_rows - 2, 0, n_rows - 1]);
    let dup = r[3];
    r.push(dup);
    r
}

/// `rows` of `a` and `b` as f32 are the same bytes.
fn assert_same_f32(a: &Table, b: &Table, rows: &[u64]) {
    assert_eq!(
        out(a, Dtype::F32, rows).unwrap(),
        out(b, Dtype::F32, rows).unwrap()
    );
}

/// Every strategy, dtype and rounding of `remote` equals `local`'s.
fn assert_same(local: &Table, remote: &Table, rows: &[u64]) {
    assert_eq!(
        (
            remote.rows(),
            remote.row_bytes(),
            remote.row_elems(),
            remote.type_name(),
            remote.name()
        ),
        (
            local.rows(),
            local.row_bytes(),
            local.row_elems(),
            local.type_name(),
            local.name()
        )
    );
    assert_eq!(
        (remote.layer(), remote.ple_layers()),
        (local.layer(), local.ple_layers())
    );
    for rounding in [Rounding::Exact, Rounding::Vllm, Rounding::Mlx] {
        let (l, r) = match (
            local.clone().with_rounding(rounding),
            remote.clone().with_rounding(rounding),
        ) {
            (Ok(l), Ok(r)) => (l, r),
            (Err(_), Err(_)) => continue,
            (l, r) => panic!("{rounding:?}: local {:?}, remote {:?}", l.err(), r.err()),
        };
        for &d in Dtype::ALL {
            let want = out(&l, d, rows).unwrap();
            for &s in Strategy::ALL {
                let r = r.clone().with_strategy(s);
                assert_eq!(out(&r, d, rows).unwrap(), want, "{rounding:?} {d:?} {s}");
            }
        }
    }
    // Row ids: the same mapping.
    let (mut a, mut b) = (local.sequence().unwrap(), remote.sequence().unwrap());
    let toks: Vec<u32> = (0..40u32).map(|i| i * 7919 % 5000).collect();
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    a.map_tokens(&toks, &mut ra).unwrap();
    b.map_tokens(&toks, &mut rb).unwrap();
    assert_eq!(ra, rb);
}

#[test]
fn a_cluster_serves_every_table_exactly_and_survives_a_master_kill() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let mut cluster = Cluster::start(3, 1, None).unwrap();
    let seed = cluster.seed();
    let mut rng = Rng::new(7);

    // A GGUF table (IQ4_NL) in small buckets, so rows spread over every master.
    let fx_q = Fixture::qwen(60_000, 3);
    let gguf = fx_q.reader();
    let p = publish(&gguf, &url(&seed, "q"), 16 << 10);
    assert_eq!(p.uploaded, p.buckets);
    let remote = Table::open(url(&seed, "q")).unwrap();
    assert_same(&gguf, &remote, &rows_of(&mut rng, gguf.rows(), 300));

    // Lookahead over the cluster (an engine queues ubatch k+1's rows while
    // k computes): the background worker's batch is the file's bytes, and
    // the rows are read from Redis once, by the worker.
    for d in [Dtype::Raw, Dtype::F32] {
        let rows = rows_of(&mut rng, gguf.rows(), 300);
        let p = remote.prefetch(&rows, d).unwrap();
        let mut v = vec![0u8; remote.out_bytes(d, rows.len()).unwrap()];
        let got = p.wait_into_bytes(&mut v).unwrap();
        assert_eq!(v, out(&gguf, d, &rows).unwrap(), "{d:?}");
        assert_eq!(got.stats.backend(), Some("redis"), "{d:?}");
    }

    // The row caches in front of the cluster: the first gather reads its
    // misses from Redis, the second finds every row in the cache.
    let rows = rows_of(&mut rng, gguf.rows(), 300);
    let mut distinct = rows.clone();
    distinct.sort_unstable();
    distinct.dedup();
    for s in [Strategy::Cached, Strategy::Shared] {
        let t = Table::open(url(&seed, "q")).unwrap().with_strategy(s);
        let mut v = vec![0u8; t.out_bytes(Dtype::Raw, rows.len()).unwrap()];
        let first = t.gather_as(Dtype::Raw, &rows, &mut v).unwrap();
        assert_eq!(v, out(&gguf, Dtype::Raw, &rows).unwrap(), "{s}");
        // (The edge rows may be in the segment already, from the gathers above.)
        assert_eq!(
            first.cache_hits + first.cache_misses,
            distinct.len() as u64,
            "{s}"
        );
        assert!(
            first.cache_misses > 250 && first.backend() == Some("redis"),
            "{s}: {first:?}"
        );
        let second = t.gather_as(Dtype::Raw, &rows, &mut v).unwrap();
        assert_eq!(
            (second.cache_hits, second.cache_misses, second.read_bytes),
            (distinct.len() as u64, 0, 0),
            "{s}"
        );
        assert_eq!(v, out(&gguf, Dtype::Raw, &rows).unwrap(), "{s}");
        // Rows seen and new ones, with repeats: the new are read (for
        // `shared`, claimed while their requests are in flight) and kept.
        let mut mixed: Vec<u64> = rows[..150].to_vec();
        mixed.extend(rows_of(&mut rng, gguf.rows(), 150));
        mixed.extend_from_slice(&rows[..20]);
        let mut m = mixed.clone();
        m.sort_unstable();
        m.dedup();
        let mut v = vec![0u8; t.out_bytes(Dtype::Raw, mixed.len()).unwrap()];
        let third = t.gather_as(Dtype::Raw, &mixed, &mut v).unwrap();
        assert_eq!(v, out(&gguf, Dtype::Raw, &mixed).unwrap(), "{s}");
        assert_eq!(third.cache_hits + third.cache_misses, m.len() as u64, "{s}");
        let mut seen = rows[..150].to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert!(
            third.cache_hits >= seen.len() as u64 && third.cache_misses > 100,
            "{s}: {third:?}"
        );
        let fourth = t.gather_as(
            Dtype::F32,
            &mixed,
            &mut vec![0u8; t.out_bytes(Dtype::F32, mixed.len()).unwrap()],
        );
        assert_eq!(fourth.unwrap().cache_misses, 0, "{s}");
    }

    // Checkpoints: FP8 (table scale), FP8 with row scales, NVFP4, MLX 4-bit.
    for enc in [
        CkptEncoding::Fp8,
        CkptEncoding::Fp8Row,
        CkptEncoding::Nvfp4,
        CkptEncoding::Mlx4,
    ] {
        let fx = CkptFixture::new(enc, 20_000, 8, 2, 5);
        let local = fx.reader();
        let name = format!("c-{}", enc.name());
        publish(&local, &url(&seed, &name), 64 << 10);
        let remote = Table::open(url(&seed, &name)).unwrap();
        let rows = rows_of(&mut rng, local.rows(), 200);
        assert_same(&local, &remote, &rows);
        assert_eq!(
            out(&remote, Dtype::Raw, &rows).unwrap(),
            fx.reference_raw(&rows)
        );
    }

    // Two tables of the same geometry under two names never mix.
    let fx_q2 = Fixture::qwen(60_000, 4);
    let other = fx_q2.reader();
    let id2 = publish(&other, &url(&seed, "q2"), 16 << 10).id;
    let (q, q2) = (
        Table::open(url(&seed, "q")).unwrap(),
        Table::open(url(&seed, "q2")).unwrap(),
    );
    let rows = rows_of(&mut rng, 60_000, 100);
    assert_eq!(
        out(&q, Dtype::Raw, &rows).unwrap(),
        out(&gguf, Dtype::Raw, &rows).unwrap()
    );
    assert_eq!(
        out(&q2, Dtype::Raw, &rows).unwrap(),
        out(&other, Dtype::Raw, &rows).unwrap()
    );
    assert_ne!(
        out(&q, Dtype::Raw, &rows).unwrap(),
        out(&q2, Dtype::Raw, &rows).unwrap()
    );

    // replicas=prefer: every read goes to a replica (and the manifest and
    // alias, single commands, to the masters), with the same bytes.
    let masters = cluster.masters().unwrap();
    let replicas: Vec<usize> = (0..cluster.nodes.len())
        .filter(|i| !masters.contains(i))
        .collect();
    let getranges = |i: usize| -> u64 {
        let stats = cluster.nodes[i].cli(&["INFO", "commandstats"]).unwrap();
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_getrange:calls="))
            .map_or(0, |v| v.split(',').next().unwrap().parse().unwrap())
    };
    for node in &cluster.nodes {
        node.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    }
    let prefer = Table::open(format!("{}&replicas=prefer", url(&seed, "q2"))).unwrap();
    let rows = rows_of(&mut rng, 60_000, 300);
    let want2 = out(&other, Dtype::Raw, &rows).unwrap();
    assert_eq!(out(&prefer, Dtype::Raw, &rows).unwrap(), want2);
    let on_masters: u64 = masters.iter().map(|&i| getranges(i)).sum();
    let on_replicas: u64 = replicas.iter().map(|&i| getranges(i)).sum();
    assert!(
        on_masters == 0 && on_replicas > 0,
        "masters {on_masters}, replicas {on_replicas}"
    );

    // Replicas behind their masters (DEBUG REPLICATE changes the replicas'
    // copy alone): q2's bucket 5 short there, bucket 6 missing, bucket 7
    // stale (q's bucket 7: the same length, other rows). Under prefer the
    // rows of the first two come from the masters, right; the stale one is
    // caught by its rows' checks, and the error names the key and row.
    let bucket_rows = (16 << 10) / (gguf.row_bytes() + 4);
    let client = pleio::remote::client::Client::connect(
        pleio::remote::url::RedisUrl::parse_with(&format!("redis://{seed}/x"), None).unwrap(),
    )
    .unwrap();
    let replicate = |key: &str, cmd: &[&[u8]]| {
        let mut args: Vec<&[u8]> = vec![b"DEBUG", b"REPLICATE"];
        args.extend_from_slice(cmd);
        let r = client.call(key, &args).unwrap();
        assert_eq!(r.bytes(), Some(&b"OK"[..]), "{}", r.describe());
    };
    let (k5, k6, k7) = (
        format!("pleio:t:{id2}:b5"),
        format!("pleio:t:{id2}:b6"),
        format!("pleio:t:{id2}:b7"),
    );
    replicate(&k5, &[b"SET", k5.as_bytes(), b"short"]);
    replicate(&k6, &[b"DEL", k6.as_bytes()]);
    let q7 = format!("pleio:t:{}:b7", p.id);
    let stale = client
        .call(&q7, &[b"GET".as_slice(), q7.as_bytes()])
        .unwrap();
    let stale = stale.bytes().unwrap().to_vec();
    replicate(&k7, &[b"SET", k7.as_bytes(), &stale]);
    cluster.wait_replicated().unwrap();
    for node in &cluster.nodes {
        node.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    }
    let behind: Vec<u64> = [5, 6]
        .iter()
        .flat_map(|b| {
            [
                b * bucket_rows,
                b * bucket_rows + 3,
                (b + 1) * bucket_rows - 1,
            ]
        })
        .chain(
            rows_of(&mut rng, 60_000, 100)
                .into_iter()
                .filter(|r| r / bucket_rows != 7),
        )
        .collect();
    assert_eq!(
        out(&prefer, Dtype::Raw, &behind).unwrap(),
        out(&other, Dtype::Raw, &behind).unwrap()
    );
    let on_masters: u64 = masters.iter().map(|&i| getranges(i)).sum();
    assert!(
        on_masters > 0,
        "the rows of the lagging buckets came from no master"
    );
    let row7 = 7 * bucket_rows + 2;
    let e = out(&prefer, Dtype::Raw, &[row7]).unwrap_err();
    assert_eq!((e.kind(), e.row()), (ErrorKind::Remote, Some(row7)), "{e}");
    assert!(e.to_string().contains(&k7), "{e}");
    // The masters were never changed: without prefer every row is right.
    assert_eq!(
        out(&q2, Dtype::Raw, &[row7]).unwrap(),
        out(&other, Dtype::Raw, &[row7]).unwrap()
    );

    // A bucket of one table copied over the other's: every row's check names it.
    let id = p.id.clone();
    let cli = |args: &[&str]| cluster.nodes[0].cli(&[&["-c"][..], args].concat()).unwrap();
    let key2 = format!("pleio:t:{id2}:b3");
    let row = 3 * bucket_rows + 5;
    let copied = redis_copy(&cluster, &format!("pleio:t:{id}:b3"), &key2);
    assert!(copied, "COPY across slots via DUMP/RESTORE");
    let e = out(&q2, Dtype::Raw, &[row]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
    assert_eq!(e.row(), Some(row), "{e}");
    assert!(e.to_string().contains(&key2), "{e}");
    // One flipped byte in the q table's bucket 1.
    let key = format!("pleio:t:{id}:b1");
    cli(&["SETRANGE", &key, "10", "\u{1}"]);
    let e = out(&q, Dtype::F32, &[bucket_rows, 0]).unwrap_err();
    assert_eq!(
        (e.kind(), e.row()),
        (ErrorKind::Remote, Some(bucket_rows)),
        "{e}"
    );
    assert!(e.to_string().contains(&key), "{e}");

    // Kill a master during a gather loop: each gather is right or a typed error.
    let masters = cluster.masters().unwrap();
    let rows = rows_of(&mut rng, 60_000, 500);
    let good: Vec<u64> = rows
        .iter()
        .copied()
        .filter(|&r| r / bucket_rows != 1)
        .collect();
    let want = out(&gguf, Dtype::Raw, &good).unwrap();
    let (mut ok, mut failed) = (0, 0);
    let started = std::time::Instant::now();
    let mut killed = false;
    while started.elapsed() < std::time::Duration::from_secs(20) {
        if !killed && ok >= 5 {
            cluster.nodes[masters[0]].kill();
            killed = true;
        }
        match out(&q, Dtype::Raw, &good) {
            Ok(v) => {
                assert_eq!(v, want, "a wrong row after {ok} gathers");
                ok += 1;
                if killed && ok >= 40 {
                    break;
                }
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
                failed += 1;
            }
        }
    }
    assert!(killed && ok >= 40, "{ok} gathers right, {failed} failed");
    cluster.wait_ok().unwrap();
    assert_eq!(out(&q, Dtype::Raw, &good).unwrap(), want);
    eprintln!("failover: {ok} gathers right, {failed} typed errors");
}

/// Copies `from` to `to` (in other slots) with DUMP and RESTORE REPLACE.
fn redis_copy(cluster: &Cluster, from: &str, to: &str) -> bool {
    let c = pleio::remote::client::Client::connect(
        pleio::remote::url::RedisUrl::parse_with(&format!("redis://{}/x", cluster.seed()), None)
            .unwrap(),
    )
    .unwrap();
    let dump = c
        .call(from, &[b"DUMP".as_slice(), from.as_bytes()])
        .unwrap();
    let Some(bytes) = dump.bytes() else {
        return false;
    };
    let r = c
        .call(
            to,
            &[
                b"RESTORE".as_slice(),
                to.as_bytes(),
                b"0",
                bytes,
                b"REPLACE",
            ],
        )
        .unwrap();
    r.bytes() == Some(b"OK")
}

#[test]
fn a_server_refuses_bad_credentials_resumes_publishing_and_names_missing_tables() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let server = Server::standalone(Some("s3cret")).unwrap();
    let addr = server.addr();
    let fx = Fixture::qwen(30_000, 9);
    let table = fx.reader();

    // Wrong and missing passwords.
    for u in [
        format!("redis://:wrong@{addr}/t"),
        format!("redis://{addr}/t"),
    ] {
        let e = table
            .publish(&u, "t", &opts(1 << 14), |_, _| {})
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
        let text = e.to_string();
        assert!(text.contains(&addr) && !text.contains("wrong"), "{text}");
        assert!(text.contains("auth") || text.contains("NOAUTH"), "{text}");
        let e = Table::open(&u).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
    }
    let good = format!("redis://:s3cret@{addr}/t");

    // Nothing published: the name is missing, not an empty table.
    let e = Table::open(&good).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("pleio publish"), "{e}");

    // Interrupted at bucket 5: the name is still missing; resumed, 5 buckets skipped.
    let stop = std::cell::Cell::new(false);
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        table.publish(&good, "t", &opts(1 << 14), |done, _| {
            if done == 5 {
                stop.set(true);
                panic!("publish interrupted on purpose (the test resumes it)");
            }
        })
    }));
    assert!(e.is_err() && stop.get());
    assert_eq!(Table::open(&good).unwrap_err().kind(), ErrorKind::NotFound);
    let p = table
        .publish(&good, "t", &opts(1 << 14), |_, _| {})
        .unwrap();
    // The first run stopped after 5 buckets were reported done; up to 3
    // more were in flight, and up to 3 more waited for a worker.
    assert!(
        p.uploaded <= p.buckets - 5 && p.uploaded + 5 + 6 >= p.buckets,
        "{p:?}"
    );
    let again = republish(&table, &good, false);
    assert_eq!((again.uploaded, &again.fingerprint), (0, &p.fingerprint));
    let remote = Table::open(&good).unwrap();
    let rows: Vec<u64> = (0..30_000).step_by(97).collect();
    assert_same_f32(&remote, &table, &rows);

    // An ACL user that may only read: it gathers; publishing is refused, named.
    server
        .cli(&[
            "-a",
            "s3cret",
            "--no-auth-warning",
            "ACL",
            "SETUSER",
            "reader",
            "on",
            ">r34d",
            "~pleio:*",
            "+get",
            "+getrange",
            "+hgetall",
            "+cluster|slots",
            "+readonly",
            "+ping",
        ])
        .unwrap();
    let reader = format!("redis://reader:r34d@{addr}/t");
    let t = Table::open(&reader).unwrap();
    assert_same_f32(&t, &table, &rows);
    let e = table
        .publish(
            &format!("redis://reader:r34d@{addr}/t2"),
            "t",
            &opts(1 << 14),
            |_, _| {},
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
    assert!(
        e.to_string().contains("NOPERM") && !e.to_string().contains("r34d"),
        "{e}"
    );
    // Another table: every upload refused, with more buckets queued than
    // workers: the error, never a hang.
    let fx3 = Fixture::qwen(30_000, 10);
    let o = pleio::remote::PublishOptions {
        in_flight: 2,
        ..opts(1 << 12)
    };
    let e = fx3
        .reader()
        .publish(
            &format!("redis://reader:r34d@{addr}/t3"),
            "t3",
            &o,
            |_, _| {},
        )
        .unwrap_err();
    assert!(e.to_string().contains("NOPERM"), "{e}");

    // A deleted bucket: a typed error naming the key, never zero rows.
    let key = format!("pleio:t:{}:b2", p.id);
    server
        .cli(&["-a", "s3cret", "--no-auth-warning", "DEL", &key])
        .unwrap();
    let rb = (1 << 14) / (table.row_bytes() + 4);
    let e = out(&remote, Dtype::F32, &[2 * rb]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
    assert!(e.to_string().contains(&key), "{e}");
    // Publishing again repairs it (its length is checked)...
    let again = republish(&table, &good, false);
    assert_eq!((again.uploaded, again.repaired), (1, 1), "{again:?}");
    assert_same_f32(&remote, &table, &rows);
    // ... and a changed byte only with verify (same length).
    server
        .cli(&[
            "-a",
            "s3cret",
            "--no-auth-warning",
            "SETRANGE",
            &key,
            "7",
            "~",
        ])
        .unwrap();
    let again = republish(&table, &good, false);
    assert_eq!(again.repaired, 0, "{again:?}");
    let again = republish(&table, &good, true);
    assert_eq!((again.uploaded, again.repaired), (1, 1), "{again:?}");
    assert_same_f32(&remote, &table, &rows);

    // Bad addresses.
    for (u, kind) in [
        (
            format!("rediss://{addr}/t?timeout_ms=300&retries=0"),
            ErrorKind::Remote,
        ),
        (format!("redis://{addr}/t?tls_ca=/c.pem"), ErrorKind::Setup),
        (format!("redis://{addr}/t?retries=x"), ErrorKind::Setup),
        (
            "redis://127.0.0.1:1/t?connect_timeout_ms=100&retries=0".to_string(),
            ErrorKind::Remote,
        ),
    ] {
        let e = Table::open(&u).unwrap_err();
        assert_eq!(e.kind(), kind, "{u}: {e}");
        if u.starts_with("rediss") {
            assert!(e.to_string().contains("speak TLS"), "{e}");
        }
    }
}

#[test]
fn tiers_fall_back_to_the_next_source_and_refuse_different_tables() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let mut server = Server::standalone(None).unwrap();
    let addr = server.addr();
    let fx = Fixture::qwen(20_000, 11);
    let table = fx.reader();
    let file = fx.file.path().to_str().unwrap().to_string();
    let base = format!("redis://{addr}/t?timeout_ms=300&retries=1&connect_timeout_ms=200");
    let p = publish(&table, &base, 1 << 14);
    let rows: Vec<u64> = (0..20_000).step_by(37).collect();
    let want = out(&table, Dtype::F32, &rows).unwrap();
    let gather = |t: &Table| {
        let mut v = vec![0u8; t.out_bytes(Dtype::F32, rows.len()).unwrap()];
        let s = t.gather_as(Dtype::F32, &rows, &mut v).unwrap();
        (
            v,
            s.fields()
                .find(|(k, _)| *k == "tier_fallbacks")
                .unwrap()
                .1
                .unwrap(),
        )
    };

    // A local copy of another table is refused at open, naming both.
    let other = Fixture::qwen(30_000, 12);
    let e = Table::open(format!("{base}&local={}", other.file.path().display())).unwrap_err();
    assert!(e.to_string().contains("tiers of different tables"), "{e}");
    // A missing local copy is an error naming it.
    let e = Table::open(format!("{base}&local=/nonexistent/x.gguf")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");

    // redis,local: Redis serves; a corrupt row, then a dead server, go to the file.
    let t = Table::open(format!("{base}&local={file}")).unwrap();
    assert_eq!(gather(&t), (want.clone(), 0));
    server
        .cli(&["SETRANGE", &format!("pleio:t:{}:b0", p.id), "0", "\u{7f}"])
        .unwrap();
    assert_eq!(
        gather(&t),
        (want.clone(), 1),
        "a corrupt row: the file served"
    );

    // local,redis: the file serves; cut short under the handle, Redis serves.
    // (Published from the copy: another file, so another id, not the
    // corrupted buckets of the same table under a second name.)
    let copy = pleio_testkit::disk_dir!().join(format!("tier-{}.gguf", std::process::id()));
    std::fs::copy(&file, &copy).unwrap();
    publish(
        &Table::open(&copy).unwrap(),
        &format!("redis://{addr}/t2"),
        1 << 14,
    );
    let t2 = Table::open(format!(
        "redis://{addr}/t2?order=local,redis&local={}",
        copy.display()
    ))
    .unwrap()
    .with_strategy(Strategy::Pread);
    assert_eq!(gather(&t2), (want.clone(), 0));
    let len = std::fs::metadata(&copy).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    assert_eq!(gather(&t2), (want.clone(), 1), "a short file: Redis served");
    std::fs::remove_file(&copy).unwrap();

    server.kill();
    assert_eq!(
        gather(&t),
        (want.clone(), 1),
        "a dead server: the file served"
    );
    // Down at open: the local copy serves alone.
    let alone = Table::open(format!("{base}&local={file}")).unwrap();
    assert_eq!(gather(&alone), (want, 0));
    // Without a local copy, a dead server is an error, never rows.
    let e = Table::open(&base).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
}

#[test]
fn tls_serves_the_same_rows_and_refuses_what_does_not_verify() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let files = TlsFiles::generate().unwrap();
    let server = Server::standalone_tls(Some("s3cret"), &files, true).unwrap();
    let addr = server.addr();
    let p = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (ca, cert, key) = (p(&files.ca), p(&files.client_cert), p(&files.client_key));
    let base = format!("rediss://:s3cret@{addr}/t");
    let good = format!("{base}?tls_ca={ca}&tls_cert={cert}&tls_key={key}");
    let fx = Fixture::qwen(30_000, 9);
    let table = fx.reader();
    let published = table
        .publish(&good, "t", &opts(1 << 14), |_, _| {})
        .unwrap();
    assert!(published.uploaded > 0);
    let remote = Table::open(&good).unwrap();
    assert!(
        remote.path().to_string_lossy().starts_with("rediss://"),
        "{:?}",
        remote.path()
    );
    assert!(!remote.path().to_string_lossy().contains("s3cret"));
    let mut rng = Rng::new(21);
    assert_same(&table, &remote, &rows_of(&mut rng, table.rows(), 300));

    // Refused: no client certificate, another CA, a name the certificate
    // does not carry, plain TCP to the TLS port. Each names the node.
    let other = TlsFiles::generate().unwrap();
    for (u, says) in [
        (format!("{base}?tls_ca={ca}&timeout_ms=2000"), ""),
        (
            format!(
                "{base}?tls_ca={}&tls_cert={cert}&tls_key={key}",
                p(&other.ca)
            ),
            "certificate",
        ),
        (format!("{good}&tls_name=redis.example"), "certificate"),
        (format!("redis://:s3cret@{addr}/t?timeout_ms=2000"), ""),
    ] {
        let e = Table::open(&u).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote, "{u}: {e}");
        let text = e.to_string();
        assert!(text.contains(&addr) && text.contains(says), "{u}: {text}");
        assert!(!text.contains("s3cret"), "{text}");
    }

    // Files that cannot be used are named, before anything connects.
    let e = Table::open(format!("{base}?tls_ca=/nonexistent/ca.pem")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Setup, "{e}");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    let e = Table::open(format!("{base}?tls_ca={cert}&tls_cert={ca}&tls_key={ca}")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Setup, "{e}");
    assert!(e.to_string().contains(&ca), "{e}");
}

#[test]
fn a_tls_cluster_serves_the_same_rows_from_masters_and_replicas() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let files = TlsFiles::generate().unwrap();
    let cluster = Cluster::start_tls(3, 1, None, &files).unwrap();
    let ca = files.ca.to_str().unwrap();
    let base = format!("rediss://{}/t?tls_ca={ca}&timeout_ms=2000", cluster.seed());
    let fx = Fixture::qwen(30_000, 13);
    let table = fx.reader();
    let p = table
        .publish(&base, "t", &opts(16 << 10), |_, _| {})
        .unwrap();
    assert_eq!(p.uploaded, p.buckets);
    let mut rng = Rng::new(31);
    let rows = rows_of(&mut rng, table.rows(), 300);
    // The slot map names every master and replica by its TLS port.
    for replicas in ["fallback", "prefer"] {
        let remote = Table::open(format!("{base}&replicas={replicas}")).unwrap();
        assert_same(&table, &remote, &rows);
    }
}
