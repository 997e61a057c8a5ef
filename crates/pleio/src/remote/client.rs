//! A Redis (Cluster) client for pleio's two jobs: pipelined `GETRANGE`s of
//! a batch's rows (one write and one read pass per node), and the single
//! commands of publishing. It knows the cluster's slot map (`CLUSTER
//! SLOTS`; a server without cluster support is one node holding every
//! slot), follows `MOVED` and `ASK`, reads a slot's replicas when its
//! master does not answer (connections to replicas send `READONLY`), and
//! bounds everything: each read, write and connect has a timeout, and a
//! batch gets `retries` more rounds after its first.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use super::resp::{self, Reply};
use super::tls::{Stream, Tls};
use super::url::{ClientOptions, RedisUrl, ReplicaReads};
use super::RemoteError;

/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// CRC16 (XMODEM, polynomial 0x1021) of every byte value.
const CRC16: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut k = 0;
        while k < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            k += 1;
        }
        t[i] = crc;
        i += 1;
    }
    t
};

/// The CRC16 (XMODEM) of `b`, Redis Cluster's key hash, continued from
/// `crc` (the CRC of the bytes before `b`; 0 at the start).
fn crc16_from(crc: u16, b: &[u8]) -> u16 {
    b.iter().fold(crc, |crc, &x| {
        (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ x)]
    })
}

/// The hash tag of `key` (Redis's `{hash tag}` rule): what is hashed.
fn hashed(key: &[u8]) -> &[u8] {
    let tagged = key.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&c| c == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    tagged.unwrap_or(key)
}

/// The hash slot of `key` (with Redis's `{hash tag}` rule).
pub fn slot(key: &[u8]) -> u16 {
    crc16_from(0, hashed(key)) % SLOTS as u16
}

/// Keys that are a fixed prefix and a number (`pleio:t:ID:b17`), with the
/// prefix's part of the slot hash done once: a batch of random rows names
/// a thousand or more such keys, and hashing each whole key cost more
/// client time than parsing its reply.
#[derive(Debug, Clone)]
pub struct NumberedKeys {
    prefix: String,
    /// The CRC of the prefix, when the prefix holds no `{` (with one, a
    /// key's hash tag may end in the number: each key is hashed whole).
    crc: Option<u16>,
}

impl NumberedKeys {
    /// Keys `prefix` followed by a decimal number.
    pub fn new(prefix: String) -> NumberedKeys {
        let crc = (!prefix.contains('{')).then(|| crc16_from(0, prefix.as_bytes()));
        NumberedKeys { prefix, crc }
    }

    /// Key `n`.
    pub fn key(&self, n: u64) -> String {
        format!("{}{n}", self.prefix)
    }

    /// Key `n` written into `out` (cleared first), without allocating once
    /// `out` has grown to a key's length.
    pub fn write(&self, n: u64, out: &mut Vec<u8>) {
        let mut d = [0u8; 20];
        out.clear();
        out.extend_from_slice(self.prefix.as_bytes());
        out.extend_from_slice(resp::digits(n, &mut d));
    }

    /// The hash slot of key `n`: [`slot`] of [`NumberedKeys::key`].
    pub fn slot(&self, n: u64) -> u16 {
        match self.crc {
            Some(crc) => crc16_from(crc, resp::digits(n, &mut [0u8; 20])) % SLOTS as u16,
            None => slot(self.key(n).as_bytes()),
        }
    }
}

/// One connection to one node.
struct Conn {
    stream: BufReader<Stream>,
}

impl Conn {
    fn open(
        node: &str,
        url: &RedisUrl,
        tls: Option<&Tls>,
        readonly: bool,
    ) -> Result<Conn, RemoteError> {
        let o = &url.options;
        let io = |source: std::io::Error| RemoteError::Io {
            node: node.to_string(),
            source,
        };
        let addrs = node.to_socket_addrs().map_err(io)?;
        let mut last = None;
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, o.connect_timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = stream.ok_or_else(|| {
            io(last.unwrap_or_else(|| std::io::Error::other("the name resolves to no address")))
        })?;
        stream.set_read_timeout(Some(o.timeout)).map_err(io)?;
        stream.set_write_timeout(Some(o.timeout)).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let stream = match tls {
            Some(t) => t.connect(node, stream)?,
            None => Stream::Plain(stream),
        };
        let mut c = Conn {
            stream: BufReader::with_capacity(256 << 10, stream),
        };
        if let Some(pw) = &url.password {
            let reply = match &url.user {
                Some(u) => c.call(node, &[b"AUTH".as_slice(), u.as_bytes(), pw.as_bytes()])?,
                None => c.call(node, &[b"AUTH".as_slice(), pw.as_bytes()])?,
            };
            if let Reply::Error(e) = reply {
                return Err(RemoteError::Auth {
                    node: node.to_string(),
                    message: e,
                });
            }
        }
        if readonly {
            // Refused by a server without cluster support: harmless.
            let _ = c.call(node, &[b"READONLY".as_slice()])?;
        }
        Ok(c)
    }

    /// Sends one command and reads its reply.
    fn call<A: AsRef<[u8]>>(&mut self, node: &str, args: &[A]) -> Result<Reply, RemoteError> {
        let mut buf = Vec::new();
        resp::encode(args, &mut buf);
        self.send(node, &buf)?;
        resp::read(&mut self.stream).map_err(|e| RemoteError::io(node, e))
    }

    fn send(&mut self, node: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        let s = self.stream.get_mut();
        s.write_all(bytes)
            .and_then(|()| s.flush())
            .map_err(|e| RemoteError::io(node, e))
    }
}

/// Who serves a range of slots.
#[derive(Debug, Clone)]
struct Owners {
    master: String,
    replicas: Vec<String>,
}

/// The slot map: `None` for a server without cluster support.
type SlotMap = Option<Vec<Option<u32>>>;

/// The slot map and the owners it points into.
type Map = (SlotMap, Vec<Owners>);

/// A client of one cluster (or one server).
pub struct Client {
    url: RedisUrl,
    /// TLS configuration of a `rediss://` address.
    tls: Option<Tls>,
    /// Slot -> index into `owners`.
    map: RwLock<Map>,
    /// Idle connections by node and kind (`true`: a read-only replica
    /// connection), taken by a batch and put back after.
    idle: Mutex<HashMap<(String, bool), Vec<Conn>>>,
}

/// One range to read: `len` bytes of key `key` of `keys` from `start`,
/// into `dst[at..at + len]` of [`Client::get_ranges`]'s buffer.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    /// Which key of the batch's [`NumberedKeys`].
    pub key: u64,
    /// Its first byte.
    pub start: u64,
    /// Bytes.
    pub len: usize,
    /// Where they go in the destination.
    pub at: usize,
}

/// Why one range of a round must be tried again.
enum Again {
    /// `MOVED`: the slot map is stale.
    Moved,
    /// `ASK`: this once, at that node.
    Ask(String),
    /// The node failed (connect, I/O, timeout) or answered short from a
    /// replica: try the slot's next owner.
    Failed,
}

impl Client {
    /// A client of the nodes in `url`; nothing is connected until used
    /// ([`Client::connect`] checks at once), but TLS files are read now.
    pub fn new(url: RedisUrl) -> Result<Client, RemoteError> {
        let tls = url.tls.as_ref().map(Tls::new).transpose()?;
        Ok(Client {
            url,
            tls,
            map: RwLock::new((None, Vec::new())),
            idle: Mutex::new(HashMap::new()),
        })
    }

    /// Connects, authenticates and reads the slot map.
    pub fn connect(url: RedisUrl) -> Result<Client, RemoteError> {
        let c = Client::new(url)?;
        c.refresh()?;
        Ok(c)
    }

    /// The address this client reads (without the password).
    pub fn url(&self) -> &RedisUrl {
        &self.url
    }

    fn options(&self) -> &ClientOptions {
        &self.url.options
    }

    /// Re-reads the slot map from the first node that answers (the seeds,
    /// then every node of the current map).
    pub fn refresh(&self) -> Result<(), RemoteError> {
        let mut candidates: Vec<String> = self.url.seeds.clone();
        if let Ok(m) = self.map.read() {
            for o in &m.1 {
                candidates.push(o.master.clone());
                candidates.extend(o.replicas.iter().cloned());
            }
        }
        candidates.dedup();
        let mut last = None;
        for node in candidates {
            match self.slots_from(&node) {
                Ok(m) => {
                    if let Ok(mut w) = self.map.write() {
                        *w = m;
                    }
                    return Ok(());
                }
                Err(e @ RemoteError::Auth { .. }) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(RemoteError::NoNode))
    }

    fn slots_from(&self, node: &str) -> Result<(SlotMap, Vec<Owners>), RemoteError> {
        let mut c = self.take(node, false)?;
        let reply = c.call(node, &["CLUSTER", "SLOTS"])?;
        self.give(node, false, c);
        let proto = |what: String| RemoteError::Protocol {
            node: node.to_string(),
            what,
        };
        let host_of = |n: &str| n.rsplit_once(':').map_or(n, |(h, _)| h).to_string();
        match reply {
            Reply::Error(e) if e.contains("cluster support disabled") => Ok((
                None,
                vec![Owners {
                    master: node.to_string(),
                    replicas: Vec::new(),
                }],
            )),
            Reply::Error(e) => Err(RemoteError::Server {
                node: node.to_string(),
                message: e,
            }),
            Reply::Array(Some(ranges)) => {
                let mut map = vec![None; SLOTS];
                let mut owners = Vec::new();
                for r in &ranges {
                    let r = r.array().filter(|r| r.len() >= 3).ok_or_else(|| {
                        proto(format!("CLUSTER SLOTS: an entry that is {}", r.describe()))
                    })?;
                    let (lo, hi) = (r[0].int(), r[1].int());
                    let (lo, hi) = match (lo, hi) {
                        (Some(lo), Some(hi)) if 0 <= lo && lo <= hi && hi < SLOTS as i64 => {
                            (lo as usize, hi as usize)
                        }
                        _ => return Err(proto("CLUSTER SLOTS: a slot range out of 0..16384".into())),
                    };
                    let addr = |n: &Reply| -> Result<String, RemoteError> {
                        let n = n.array().filter(|n| n.len() >= 2);
                        let (ip, port) = n
                            .and_then(|n| Some((n[0].bytes()?, n[1].int()?)))
                            .ok_or_else(|| proto("CLUSTER SLOTS: a node without address".into()))?;
                        let ip = String::from_utf8_lossy(ip);
                        let ip = if ip.is_empty() || ip == "?" {
                            host_of(node)
                        } else {
                            ip.into_owned()
                        };
                        Ok(format!("{ip}:{port}"))
                    };
                    let o = Owners {
                        master: addr(&r[2])?,
                        replicas: r[3..].iter().map(addr).collect::<Result<_, _>>()?,
                    };
                    let id = owners.len() as u32;
                    owners.push(o);
                    for s in &mut map[lo..=hi] {
                        *s = Some(id);
                    }
                }
                Ok((Some(map), owners))
            }
            other => Err(proto(format!("CLUSTER SLOTS answered {}", other.describe()))),
        }
    }

    /// The owner of `slot` to try after `tried` of them failed (wrapping
    /// to the first), in the order the replica policy gives: the index of
    /// the slot's owners in the map, and which of them (0: the master).
    fn pick(&self, m: &Map, slot: u16, tried: usize) -> Option<(u32, u32)> {
        let i = owner_index(m, slot)?;
        let n = 1 + m.1.get(i as usize)?.replicas.len() as u32;
        let order = |k: u32| match self.options().replicas {
            ReplicaReads::Never => 0,
            ReplicaReads::Fallback => k % n,
            ReplicaReads::Prefer => (k + 1) % n,
        };
        let k = if self.options().replicas == ReplicaReads::Never || tried as u32 >= n {
            0
        } else {
            tried as u32
        };
        Some((i, order(k)))
    }

    /// The node (and whether it is a replica) [`Client::pick`] chose.
    fn node_of(m: &Map, (i, member): (u32, u32)) -> Option<NodeKey> {
        let o = m.1.get(i as usize)?;
        match member {
            0 => Some((o.master.clone(), false)),
            r => Some((o.replicas.get(r as usize - 1)?.clone(), true)),
        }
    }

    /// The master of `slot`, whatever the replica policy (single commands
    /// write, or read what was just written).
    fn master_of(&self, slot: u16) -> Option<String> {
        let m = self.map.read().unwrap_or_else(|e| e.into_inner());
        Some(m.1.get(owner_index(&m, slot)? as usize)?.master.clone())
    }

    fn take(&self, node: &str, readonly: bool) -> Result<Conn, RemoteError> {
        let pooled = self
            .idle
            .lock()
            .ok()
            .and_then(|mut p| p.get_mut(&(node.to_string(), readonly))?.pop());
        match pooled {
            Some(c) => Ok(c),
            None => Conn::open(node, &self.url, self.tls.as_ref(), readonly),
        }
    }

    fn give(&self, node: &str, readonly: bool, c: Conn) {
        if let Ok(mut p) = self.idle.lock() {
            let v = p.entry((node.to_string(), readonly)).or_default();
            if v.len() < 16 {
                v.push(c);
            }
        }
    }

    /// Runs one command on the node owning `key` (following `MOVED` and
    /// `ASK`, retrying failed nodes), on its master.
    pub fn call(&self, key: &str, args: &[&[u8]]) -> Result<Reply, RemoteError> {
        let s = slot(key.as_bytes());
        let mut last = None;
        let mut ask: Option<String> = None;
        for round in 0..=self.options().retries {
            if round > 0 {
                self.pause(round);
            }
            let node = match ask.take() {
                Some(n) => n,
                None => match self.master_of(s) {
                    Some(n) => n,
                    None => {
                        last = Some(RemoteError::Uncovered { slot: s, key: key.into() });
                        let _ = self.refresh();
                        continue;
                    }
                },
            };
            let mut c = match self.take(&node, false) {
                Ok(c) => c,
                Err(e @ RemoteError::Auth { .. }) => return Err(e),
                Err(e) => {
                    last = Some(e);
                    let _ = self.refresh();
                    continue;
                }
            };
            match c.call(&node, args) {
                Ok(Reply::Error(e)) => {
                    self.give(&node, false, c);
                    match redirect(&e) {
                        Some(Again::Moved) => {
                            last = Some(RemoteError::Redirected { key: key.into(), message: e });
                            let _ = self.refresh();
                        }
                        Some(Again::Failed) => {
                            last = Some(RemoteError::Server { node, message: e });
                            let _ = self.refresh();
                        }
                        Some(Again::Ask(to)) => {
                            // One ASKING + command on the target node.
                            let mut t = self.take(&to, false)?;
                            let _ = t.call(&to, &["ASKING"])?;
                            let r = t.call(&to, args)?;
                            self.give(&to, false, t);
                            return Ok(r);
                        }
                        None => {
                            return Err(RemoteError::Server {
                                node,
                                message: e,
                            })
                        }
                    }
                }
                Ok(r) => {
                    self.give(&node, false, c);
                    return Ok(r);
                }
                Err(e) => {
                    last = Some(e);
                    let _ = self.refresh();
                }
            }
        }
        Err(last.unwrap_or(RemoteError::NoNode))
    }

    /// Waits before retry round `round` (50 ms, 100 ms, ... up to 1 s):
    /// long enough for a cluster to promote a replica over a few rounds.
    fn pause(&self, round: u32) {
        let ms = 50u64.saturating_mul(1 << round.min(5)).min(1000);
        std::thread::sleep(Duration::from_millis(ms));
    }

    /// Reads every range into `dst`: the commands for each node are written
    /// in one pass, then the replies read in order. Ranges that come back
    /// moved, from a failed node, or short from a replica are tried again
    /// (up to `retries` more rounds). A range that comes back short from a
    /// master (the key is missing or shorter) is an error naming its key.
    pub fn get_ranges(
        &self,
        keys: &NumberedKeys,
        ranges: &[Range],
        dst: &mut [u8],
    ) -> Result<(), RemoteError> {
        self.get_ranges_then(keys, ranges, dst, &mut || {})
    }

    /// [`Client::get_ranges`], calling `during` once while the first
    /// round's requests are in flight (after they are written, before the
    /// first reply is read), or before returning `Ok` when there is no
    /// range: work that overlaps the round trip. (Every later round comes
    /// after the first's call.)
    pub(crate) fn get_ranges_then(
        &self,
        keys: &NumberedKeys,
        ranges: &[Range],
        dst: &mut [u8],
        during: &mut dyn FnMut(),
    ) -> Result<(), RemoteError> {
        let mut during = Some(during);
        for r in ranges {
            if r.len == 0 || r.at.checked_add(r.len).is_none_or(|end| end > dst.len()) {
                return Err(RemoteError::Protocol {
                    node: String::new(),
                    what: format!("a range of {} bytes at {} outside the buffer", r.len, r.at),
                });
            }
        }
        let mut pending: Vec<Pending> = (0..ranges.len())
            .map(|range| Pending {
                range,
                tried: 0,
                ask: None,
            })
            .collect();
        let mut round = Round {
            last: None,
            stale: false,
            next: Vec::new(),
        };
        for n in 0..=self.options().retries {
            if pending.is_empty() {
                if let Some(f) = during.take() {
                    f();
                }
                return Ok(());
            }
            if n > 0 {
                self.pause(n);
            }
            round.stale = false;
            let mut by_node: HashMap<NodeKey, Vec<Pending>> = HashMap::new();
            let mut by_owner: HashMap<(u32, u32), Vec<Pending>> = HashMap::new();
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            for p in pending.drain(..) {
                let key = ranges[p.range].key;
                if let Some(to) = &p.ask {
                    by_node.entry((to.clone(), false)).or_default().push(p);
                    continue;
                }
                let slot = keys.slot(key);
                match self.pick(&map, slot, p.tried) {
                    Some(owner) => by_owner.entry(owner).or_default().push(p),
                    None => {
                        round.last = Some(RemoteError::Uncovered {
                            slot,
                            key: keys.key(key),
                        });
                        round.stale = true;
                        round.next.push(Pending { tried: 0, ..p });
                    }
                }
            }
            for (owner, items) in by_owner {
                match Client::node_of(&map, owner) {
                    Some(node) => by_node.entry(node).or_default().extend(items),
                    None => round.fail(RemoteError::NoNode, items),
                }
            }
            drop(map);
            // Write every node's commands, then read every node's replies.
            let mut sent = Vec::new();
            for (node, items) in by_node {
                match self.send_ranges(&node, (keys, ranges), &items) {
                    Ok(conn) => sent.push((node, items, conn)),
                    Err(e @ RemoteError::Auth { .. }) => return Err(e),
                    Err(e) => round.fail(e, items),
                }
            }
            if let Some(f) = during.take() {
                f();
            }
            for (node, items, conn) in sent {
                self.read_ranges(node, (keys, ranges), items, conn, dst, &mut round)?;
            }
            if round.stale {
                let _ = self.refresh();
            }
            pending = std::mem::take(&mut round.next);
        }
        if pending.is_empty() {
            return Ok(());
        }
        Err(RemoteError::GaveUp {
            ranges: pending.len(),
            key: keys.key(ranges[pending[0].range].key),
            rounds: self.options().retries + 1,
            last: Box::new(round.last.unwrap_or(RemoteError::NoNode)),
        })
    }

    /// Writes the `GETRANGE`s of `items` (each after an `ASKING` when
    /// redirected so) to `node` in one write.
    fn send_ranges(
        &self,
        node: &NodeKey,
        (keys, ranges): (&NumberedKeys, &[Range]),
        items: &[Pending],
    ) -> Result<Conn, RemoteError> {
        let mut c = self.take(&node.0, node.1)?;
        let mut buf = Vec::with_capacity(items.len() * 64);
        let mut key = Vec::new();
        for p in items {
            let r = &ranges[p.range];
            if p.ask.is_some() {
                resp::encode(&["ASKING"], &mut buf);
            }
            let (mut a, mut b) = ([0u8; 20], [0u8; 20]);
            let end = r.start + r.len as u64 - 1;
            keys.write(r.key, &mut key);
            resp::encode(
                &[
                    b"GETRANGE".as_slice(),
                    &key,
                    resp::digits(r.start, &mut a),
                    resp::digits(end, &mut b),
                ],
                &mut buf,
            );
        }
        c.send(&node.0, &buf)?;
        Ok(c)
    }

    /// Reads the replies to [`Client::send_ranges`] into `dst`; what must be
    /// tried again goes to `round`. A master's short reply or another
    /// server error ends the batch.
    fn read_ranges(
        &self,
        (node, replica): NodeKey,
        (keys, ranges): (&NumberedKeys, &[Range]),
        items: Vec<Pending>,
        mut c: Conn,
        dst: &mut [u8],
        round: &mut Round,
    ) -> Result<(), RemoteError> {
        let mut line = Vec::new();
        for (k, p) in items.iter().enumerate() {
            let r = &ranges[p.range];
            let into = &mut dst[r.at..r.at + r.len];
            let reply = match p.ask {
                Some(_) => resp::read(&mut c.stream)
                    .and_then(|_| resp::read_into(&mut c.stream, into, &mut line)),
                None => resp::read_into(&mut c.stream, into, &mut line),
            };
            let again = |tried| Pending {
                range: p.range,
                tried,
                ask: None,
            };
            match reply {
                Ok(None) => {}
                Ok(Some(Reply::Error(e))) => match redirect(&e) {
                    Some(Again::Moved) => {
                        round.stale = true;
                        round.last = Some(RemoteError::Redirected {
                            key: keys.key(r.key),
                            message: e,
                        });
                        round.next.push(again(0));
                    }
                    Some(Again::Ask(to)) => round.next.push(Pending {
                        ask: Some(to),
                        ..again(p.tried)
                    }),
                    Some(Again::Failed) => {
                        round.stale = true;
                        round.last = Some(RemoteError::Server {
                            node: node.clone(),
                            message: e,
                        });
                        round.next.push(again(p.tried));
                    }
                    None => return Err(RemoteError::Server { node, message: e }),
                },
                Ok(Some(other)) => {
                    let short = RemoteError::Short {
                        node: node.clone(),
                        key: keys.key(r.key),
                        start: r.start,
                        want: r.len,
                        got: other.bytes().map_or(0, <[u8]>::len),
                    };
                    if !replica {
                        return Err(short);
                    }
                    // A replica behind its master: ask the slot's next owner.
                    round.last = Some(short);
                    round.next.push(again(p.tried + 1));
                }
                Err(e) => {
                    // The connection is dropped; everything unread is retried elsewhere.
                    round.fail(RemoteError::io(&node, e), items.into_iter().skip(k).collect());
                    return Ok(());
                }
            }
        }
        self.give(&node, replica, c);
        Ok(())
    }
}

/// A node and whether the connection is a read-only (replica) one.
type NodeKey = (String, bool);

/// A range still to read: which, how many of its slot's owners failed,
/// and the node an `ASK` sent it to.
struct Pending {
    range: usize,
    tried: usize,
    ask: Option<String>,
}

/// What one round leaves for the next.
struct Round {
    /// The last failure (reported if the rounds run out).
    last: Option<RemoteError>,
    /// The slot map must be read again.
    stale: bool,
    /// Ranges to try again.
    next: Vec<Pending>,
}

impl Round {
    /// `items` failed on their node with `e`: they go to their slots' next owners.
    fn fail(&mut self, e: RemoteError, items: Vec<Pending>) {
        self.last = Some(e);
        self.stale = true;
        self.next.extend(items.into_iter().map(|p| Pending {
            range: p.range,
            tried: p.tried + 1,
            ask: None,
        }));
    }
}

/// `MOVED` / `ASK` in a server error.
fn redirect(e: &str) -> Option<Again> {
    let mut w = e.split_whitespace();
    match w.next()? {
        "MOVED" => Some(Again::Moved),
        "ASK" => {
            let _slot = w.next()?;
            Some(Again::Ask(w.next()?.to_string()))
        }
        "TRYAGAIN" | "CLUSTERDOWN" | "LOADING" => Some(Again::Failed),
        _ => None,
    }
}

/// The index of `slot`'s owners in the map (0 for a standalone server);
/// None for a slot no node serves.
fn owner_index(m: &Map, slot: u16) -> Option<u32> {
    match &m.0 {
        None => Some(0),
        Some(map) => map[slot as usize],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_redis() {
        // Values from Redis's own CLUSTER KEYSLOT.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        // CRC16/XMODEM's check value (below 16384, so its own slot).
        assert_eq!(slot(b"123456789"), 0x31C3);
    }

    #[test]
    fn numbered_keys_hash_as_whole_keys() {
        // The prefix's CRC continued over the number equals the whole key's
        // slot; a prefix with a `{` (a hash tag the number may close) is
        // hashed whole.
        for prefix in ["pleio:t:0123456789abcdef:b", "", "a{", "{t}x", "{"] {
            let keys = NumberedKeys::new(prefix.to_string());
            let mut buf = Vec::new();
            for n in [0, 1, 9, 10, 12345, 999_999, u64::MAX] {
                let key = keys.key(n);
                keys.write(n, &mut buf);
                assert_eq!(buf, key.as_bytes(), "{prefix} {n}");
                assert_eq!(keys.slot(n), slot(key.as_bytes()), "{key}");
            }
        }
        // CRC16/XMODEM's check value, the prefix's CRC continued over "9".
        assert_eq!(NumberedKeys::new("12345678".into()).slot(9), 0x31C3);
        // A tag closed in the prefix: only the tag is hashed.
        assert_eq!(NumberedKeys::new("a{b}".into()).slot(7), slot(b"b"));
    }
}
