//! Getting a node ready: its state directory, the manifest, and the engine
//! (resumed from a checkpoint, synced from a peer, or fresh).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    path::{Path, PathBuf},
    time::Duration,
};

use futures::{StreamExt, stream::FuturesUnordered};
use libp2p::PeerId;
use prometheus_client::metrics::{counter::Counter, family::Family};
use ragtag_protocol::{
    Keypair,
    engine::{
        Engine, ReplicaState, Strategy,
        anti_entropy::relative_distance,
        snapshot::StateError,
        state_transfer::{self, StateHead},
        trust,
    },
    ids::{Hash32, RunId},
    manifest::Manifest,
    time::Micros,
};

use crate::{
    checkpoint::{self, CheckpointError},
    manifest_file::{self, ManifestFileError},
    metrics::ReasonLabel,
    net::Client,
    runtime::fetch,
};

/// Most peers a joiner takes the replica state from, to check them against
/// each other.
pub(crate) const MAX_STATE_SOURCES: usize = 4;
/// Times a joiner asks again when the states served disagree (honest
/// replicas a batch apart disagree for a moment, then are identical).
const STATE_ATTEMPTS: usize = 3;
/// Pause between those attempts.
const STATE_RETRY_PAUSE: Duration = Duration::from_secs(2);
/// Longest wait for a holder's state head (small): a peer that does not
/// answer must not hold the join up for the whole request timeout.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How much longer the other holders get once one head is in: an honest
/// holder answers within a round trip.
const HEAD_GRACE: Duration = Duration::from_secs(2);
/// A head held longer than this while other holders were waited on is
/// asked for again (a round trip to a peer that answered promptly) before
/// its state is fetched: aggregated ticks are a second at least.
const HEAD_FRESH: Duration = Duration::from_millis(250);

/// Why a node could not get ready: `ragtag run` prints it and exits.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// A state directory could not be created.
    #[error("creating {path}")]
    CreateStateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The lock file could not be created.
    #[error(transparent)]
    LockFile(std::io::Error),
    /// Another node holds the state directory.
    #[error("{path} is used by another running node (choose another --state)")]
    StateDirInUse {
        /// The directory.
        path: PathBuf,
    },
    /// Every fallback directory is held by another node.
    #[error("no free state directory next to {path}")]
    NoFreeStateDir {
        /// The directory asked for.
        path: PathBuf,
    },
    /// The manifest file could not be read.
    #[error(transparent)]
    ManifestFile(#[from] ManifestFileError),
    /// `--run-id` is not a run id.
    #[error("--run-id must be 64 hex digits")]
    BadRunId,
    /// `--run-id` without peers to ask.
    #[error("--run-id needs --bootstrap peers to fetch the manifest from")]
    NoPeersForRunId,
    /// Neither the run's holders (found through the DHT) nor the bootstrap
    /// peers served the run's manifest.
    #[error(
        "could not fetch the manifest of run {run}: neither its holders in the DHT nor the bootstrap peers served it"
    )]
    ManifestNotFound {
        /// The run.
        run: RunId,
    },
    /// `--strategy` names no strategy.
    #[error("unknown strategy {0:?}")]
    UnknownStrategy(String),
    /// Our engine checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Our engine checkpoint belongs to another configuration (the reason is
    /// part of the message, so it is not repeated as a source).
    #[error("our checkpoint does not fit the manifest: {0}")]
    CheckpointMismatch(StateError),
}

/// An exclusively locked state directory (released when dropped).
#[derive(Debug)]
pub struct StateDir {
    /// The directory.
    pub path: PathBuf,
    _lock: File,
}

#[allow(unsafe_code)]
fn try_lock(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a valid, open file descriptor owned by `file`.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

impl StateDir {
    /// Locks `path`; when `fallback` is set and it is in use by another
    /// node, tries `path-2`, `path-3`, ... (two nodes started from the same
    /// directory with the defaults each get their own state).
    pub fn lock(path: &Path, fallback: bool) -> Result<Self, StartupError> {
        for i in 1..=64 {
            let candidate = if i == 1 { path.to_path_buf() } else { PathBuf::from(format!("{}-{i}", path.display())) };
            if let Err(source) = std::fs::create_dir_all(&candidate) {
                return Err(StartupError::CreateStateDir { path: candidate, source });
            }
            let file = File::create(candidate.join("node.lock")).map_err(StartupError::LockFile)?;
            if try_lock(&file) {
                if i > 1 {
                    tracing::info!("{} is used by another node: using {}", path.display(), candidate.display());
                }
                return Ok(Self { path: candidate, _lock: file });
            }
            if !fallback {
                return Err(StartupError::StateDirInUse { path: candidate });
            }
        }
        Err(StartupError::NoFreeStateDir { path: path.to_path_buf() })
    }
}

/// The manifest to run: a file, the built-in run, or fetched by run id.
pub async fn manifest(
    file: Option<&Path>,
    run_id: Option<&str>,
    strategy: Option<&str>,
    net: Option<(&Client, &[PeerId])>,
) -> Result<Manifest, StartupError> {
    if let Some(f) = file {
        return Ok(manifest_file::read(f)?);
    }
    if let Some(id) = run_id {
        let run = RunId(ragtag_protocol::ids::Hash32::from_hex(id).ok_or(StartupError::BadRunId)?);
        let Some((net, peers)) = net else { return Err(StartupError::NoPeersForRunId) };
        return crate::run_lookup::manifest(net, run, peers).await.ok_or(StartupError::ManifestNotFound { run });
    }
    let strategy = match strategy {
        Some(s) => Strategy::parse(s).ok_or_else(|| StartupError::UnknownStrategy(s.to_string()))?,
        None => Strategy::Gopals,
    };
    Ok(Manifest::builtin(strategy))
}

/// How the engine came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// From our own checkpoint.
    Resumed,
    /// From a peer's replica state.
    Joined,
    /// From the run's initial weights.
    Fresh,
}

/// Everything the engine needs to be built.
#[allow(missing_debug_implementations)]
pub struct EngineSetup<'a> {
    /// The run.
    pub manifest: &'a Manifest,
    /// Our key.
    pub key: &'a Keypair,
    /// The state directory.
    pub state: &'a Path,
    /// The trainer's initial parameters.
    pub initial: Vec<f32>,
    /// Our measured speed.
    pub speed: f32,
    /// A seed for the engine's random choices.
    pub seed: u64,
    /// Peers to sync from, with the network.
    pub peers: Vec<PeerId>,
    /// The network.
    pub net: &'a Client,
    /// Where refused states are counted, by reason.
    pub refused: &'a Family<ReasonLabel, Counter>,
}

/// Resumes from our checkpoint, else joins from a peer, else starts fresh.
pub async fn engine(s: EngineSetup<'_>) -> Result<(Engine, Origin), StartupError> {
    let run_id = s.manifest.run_id();
    let t0 = Micros(s.manifest.start_ms.saturating_mul(1000));
    let me = s.key.node_id();
    if let Some(mut ck) = checkpoint::load_engine(s.state, run_id)? {
        // This start's measurement, not the old process's last estimate: the
        // machine (or its load) may have changed since.
        ck.speed = s.speed;
        ck.replica.verify(&s.manifest.engine, s.initial.len()).map_err(StartupError::CheckpointMismatch)?;
        return Ok((Engine::resume(s.manifest.engine, me, run_id, t0, ck, s.seed), Origin::Resumed));
    }
    // Peers that subscribe after settle ended are nodes of the run too:
    // with only the first few asked, a poisoner among them and one honest
    // peer could keep every attempt from agreeing, or a lone poisoner be
    // the only one asked. So each retry asks them as well.
    let mut sources = s.peers.clone();
    let mut ever_asked = BTreeSet::new();
    // A state a tick behind on the last attempt, kept in case the peers
    // that served it serve none better when asked once more.
    let (mut attempt, mut behind) = (0, None);
    while attempt < STATE_ATTEMPTS {
        attempt += 1;
        ever_asked.extend(asked(&sources));
        let Attempt { served, result } = vouched_state(&s, &sources).await;
        let last = attempt == STATE_ATTEMPTS;
        match result {
            // Aggregated, a state a tick behind lacks sums whose hashes were
            // announced before we listened: asked again while attempts
            // last, and the last once more of the peers that served it
            // (they answer at once; a state fetched at a tick's end is
            // behind by the time it is in).
            Ok(Some(v)) if !(v.state.current_at(&s.manifest.engine, super::now()) || (last && behind.is_some())) => {
                tracing::info!("attempt {attempt} of {STATE_ATTEMPTS} to sync: the state served is a tick behind");
                tokio::time::sleep(STATE_RETRY_PAUSE / 4).await;
                if last {
                    behind = Some(v);
                    attempt -= 1;
                    sources = served;
                    continue;
                }
            }
            Ok(Some(v)) => {
                if v.checked_against == 0 && !last {
                    let next = next_sources(&served, subscribed_now(s.net).await, &s.peers, &ever_asked);
                    if asks_someone_new(&next, &ever_asked) {
                        tracing::info!(
                            "attempt {attempt} of {STATE_ATTEMPTS} to sync: only {} served a state, and peers not \
                             asked yet have joined the run's topic: asking them too",
                            v.peer
                        );
                        sources = next;
                        continue;
                    }
                }
                return Ok(join_with(&s, v));
            }
            Ok(None) => break,
            Err(reason) if last => {
                s.refused.get_or_create(&ReasonLabel { reason: reason.name().into() }).inc();
                if behind.is_none() {
                    tracing::warn!(
                        "no replica state could be trusted ({reason}): starting from the run's initial weights"
                    );
                }
            }
            Err(reason) => {
                tracing::info!("attempt {attempt} of {STATE_ATTEMPTS} to sync: {reason}; asking again");
                tokio::time::sleep(STATE_RETRY_PAUSE).await;
            }
        }
        // Taken after the pause: peers that subscribed during it count.
        sources = next_sources(&served, subscribed_now(s.net).await, &s.peers, &ever_asked);
    }
    if let Some(v) = behind {
        return Ok(join_with(&s, v));
    }
    Ok((Engine::new(s.manifest.engine, me, run_id, t0, s.initial, s.speed, s.seed), Origin::Fresh))
}

/// The engine joined from `v`, saying how far the state could be checked.
fn join_with(s: &EngineSetup<'_>, v: Vouched) -> (Engine, Origin) {
    if !v.state.current_at(&s.manifest.engine, super::now()) {
        tracing::warn!(
            "joined with a state a tick behind (served so on the last attempt and once more): it may lack sums \
             announced before we listened, until anti-entropy averages our replica with a peer's"
        );
    }
    if v.checked_against == 0 {
        tracing::warn!(
            "joined with the state of {} (round {}), the only peer that served one: it could not be checked against \
             another",
            v.peer,
            v.state.round
        );
    } else {
        tracing::info!(
            "joined with the state of {} (round {}), checked against {} other peers",
            v.peer,
            v.state.round,
            v.checked_against
        );
    }
    let (me, run_id, t0) = (s.key.node_id(), s.manifest.run_id(), Micros(s.manifest.start_ms.saturating_mul(1000)));
    (Engine::join(s.manifest.engine, me, run_id, t0, v.state, s.speed, s.seed), Origin::Joined)
}

/// A replica state to join with, and how many other peers' states it was
/// checked against (none: the only one served).
struct Vouched {
    peer: PeerId,
    state: ReplicaState,
    checked_against: usize,
}

/// What one attempt to sync found.
struct Attempt {
    /// The peers whose state arrived whole and valid, agreeing or not.
    served: Vec<PeerId>,
    result: Result<Option<Vouched>, trust::StateRefusal>,
}

/// One attempt at the replica state to join with: fetched from `sources`
/// (up to [`MAX_STATE_SOURCES`]) at once and taken only when another
/// peer's state agrees with it (see [`trust::vouched_state`]), or when it
/// is the only one served; `Ok(None)` when no peer served one.
async fn vouched_state(s: &EngineSetup<'_>, sources: &[PeerId]) -> Attempt {
    let refuse = |reason: &str| s.refused.get_or_create(&ReasonLabel { reason: reason.into() }).inc();
    // Heads first (small): holders whose shared parts have the same hash
    // hold the same bytes, so each shared part is taken once, in chunks
    // from all of its holders at once.
    let mut by_shared: BTreeMap<(Hash32, u64), Vec<(PeerId, StateHead)>> = BTreeMap::new();
    for (peer, head) in state_heads(s, sources).await {
        by_shared.entry((head.shared_hash, head.shared_len)).or_default().push((peer, head));
    }
    let heads_served = !by_shared.is_empty();
    // Every shared part at once (holders a batch apart hold different ones,
    // and a holder keeps a snapshot only so long).
    let groups = by_shared.into_values().map(|holders| shared_states(s, holders));
    let mut served: Vec<(PeerId, ReplicaState)> = Vec::new();
    for states in futures::future::join_all(groups).await {
        for (peer, state) in states {
            match state.verify(&s.manifest.engine, s.initial.len()) {
                Ok(()) => served.push((peer, state)),
                Err(e) => {
                    refuse("invalid");
                    tracing::warn!("replica state from {peer} refused: {e}");
                }
            }
        }
    }
    if served.is_empty() && heads_served {
        // Peers offered a state, but none could be put together: ask again.
        tracing::info!("peers offered replica states, but none arrived whole");
        return Attempt { served: Vec::new(), result: Err(trust::StateRefusal::Unvouched) };
    }
    if served.is_empty() {
        return Attempt { served: Vec::new(), result: Ok(None) };
    }
    for (i, (a, sa)) in served.iter().enumerate() {
        for (b, sb) in &served[i + 1..] {
            if let Some(d) = relative_distance(&sa.anchor, &sb.anchor) {
                tracing::info!("replica states of {a} and {b} differ by {d:.2e} (relative)");
            }
        }
    }
    let peers: Vec<PeerId> = served.iter().map(|(p, _)| *p).collect();
    let states: Vec<&ReplicaState> = served.iter().map(|(_, st)| st).collect();
    let result = match trust::vouched_state(&states) {
        Ok(i) => {
            let (peer, state) = served.swap_remove(i);
            for (other, _) in served.iter().filter(|(_, st)| !trust::states_agree(&state, st)) {
                refuse(trust::StateRefusal::Unvouched.name());
                tracing::warn!("the replica state from {other} disagrees with the one the others vouch for: not used");
            }
            Ok(Some(Vouched { peer, state, checked_against: served.len() }))
        }
        Err(reason) => Err(reason),
    };
    Attempt { served: peers, result }
}

/// The connected peers subscribed to the run's topic now (none if the
/// network cannot say).
async fn subscribed_now(net: &Client) -> Vec<PeerId> {
    net.info().await.map(|info| info.subscribed).unwrap_or_default()
}

/// The peers to ask again: those that served a state last time (an honest
/// one keeps its place however many others subscribed), then peers never
/// asked (subscribed to the run's topic since, or named by the DHT), then
/// those asked before that served nothing.
fn next_sources(
    served: &[PeerId],
    mut subscribed: Vec<PeerId>,
    settled: &[PeerId],
    ever_asked: &BTreeSet<PeerId>,
) -> Vec<PeerId> {
    subscribed.sort();
    let never_asked = subscribed.iter().chain(settled).filter(|p| !ever_asked.contains(p));
    let asked_before = settled.iter().chain(&subscribed).filter(|p| ever_asked.contains(p));
    let mut next = served.to_vec();
    for p in never_asked.chain(asked_before) {
        if !next.contains(p) {
            next.push(*p);
        }
    }
    next
}

/// Whether an attempt with `sources` asks a peer no attempt asked yet.
fn asks_someone_new(sources: &[PeerId], ever_asked: &BTreeSet<PeerId>) -> bool {
    asked(sources).iter().any(|p| !ever_asked.contains(p))
}

/// The peers an attempt asks, of `sources`.
fn asked(sources: &[PeerId]) -> BTreeSet<PeerId> {
    sources.iter().take(MAX_STATE_SOURCES).copied().collect()
}

/// The state heads of up to [`MAX_STATE_SOURCES`] of `sources`: all that come
/// within [`HEAD_TIMEOUT`], and no later than [`HEAD_GRACE`] after the
/// first, so that peers that never answer cannot hold the join up. Heads
/// held longer than [`HEAD_FRESH`] while others were waited on are asked
/// for again from the peers that gave them: they name states their
/// holders have moved past (with aggregated dissemination, by a tick or
/// more, so the joiner would lack sums its peers applied meanwhile).
async fn state_heads(s: &EngineSetup<'_>, sources: &[PeerId]) -> Vec<(PeerId, StateHead)> {
    let (heads, first) = heads_of(s, asked(sources)).await;
    let Some(first) = first.filter(|t| t.elapsed() > HEAD_FRESH) else {
        return heads;
    };
    tracing::info!(
        "asking {} peer(s) again for the state's head: theirs are {:.1} s old after waiting on the others",
        heads.len(),
        first.elapsed().as_secs_f64()
    );
    let (mut fresh, _) = heads_of(s, heads.iter().map(|(p, _)| *p).collect()).await;
    // A peer that answered before keeps its place in the check between
    // states (with its old head) if it does not answer again in time.
    for (peer, head) in heads {
        if !fresh.iter().any(|(p, _)| *p == peer) {
            fresh.push((peer, head));
        }
    }
    fresh
}

/// The heads of `peers` that come in time (see [`state_heads`]), and when
/// the first came.
async fn heads_of(
    s: &EngineSetup<'_>,
    mut waiting: BTreeSet<PeerId>,
) -> (Vec<(PeerId, StateHead)>, Option<tokio::time::Instant>) {
    let run_id = s.manifest.run_id();
    let mut pending: FuturesUnordered<_> =
        waiting.iter().map(|&peer| async move { (peer, fetch::state_head(s.net, peer, run_id).await) }).collect();
    let mut deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    let mut heads = Vec::new();
    let mut first = None;
    while let Ok(Some((peer, result))) = tokio::time::timeout_at(deadline, pending.next()).await {
        waiting.remove(&peer);
        match result {
            Ok(head) => {
                heads.push((peer, head));
                let now = tokio::time::Instant::now();
                first.get_or_insert(now);
                deadline = deadline.min(now + HEAD_GRACE);
            }
            Err(e) => tracing::info!("no replica state from {peer}: {e}"),
        }
    }
    for peer in waiting {
        tracing::info!("no replica state from {peer}: no answer in time");
    }
    (heads, first)
}

/// The states of `holders`, whose heads name the same shared part: taken
/// once, in chunks from all of them at once; if that fails (one of them
/// served wrong bytes or none), from each alone, so one bad holder cannot
/// spoil the others' state.
async fn shared_states(s: &EngineSetup<'_>, holders: Vec<(PeerId, StateHead)>) -> Vec<(PeerId, ReplicaState)> {
    let run_id = s.manifest.run_id();
    let peers: Vec<PeerId> = holders.iter().map(|(p, _)| *p).collect();
    let mut shown = 0;
    let progress = |done: u64, total: u64| {
        // A line at every quarter of the download.
        let quarter = (done * 4 / total.max(1)) as usize;
        if quarter > shown {
            shown = quarter;
            tracing::info!(
                "replica state: {:.1} of {:.1} MB ({}%) from {} peer(s)",
                done as f64 / 1e6,
                total as f64 / 1e6,
                done * 100 / total.max(1),
                peers.len()
            );
        }
    };
    let shared = match fetch::shared_state(s.net, &peers, run_id, &holders[0].1, progress).await {
        Ok(shared) => {
            let split: Vec<String> =
                peers.iter().zip(&shared.per_holder).map(|(p, n)| format!("{n} from {p}")).collect();
            tracing::info!("replica state's shared part: chunks {}", split.join(", "));
            Some(shared.bytes)
        }
        Err(e) if holders.len() > 1 => {
            tracing::warn!("the shared state of {} peers did not arrive whole ({e}): asking each alone", peers.len());
            None
        }
        Err(e) => {
            tracing::info!("no replica state from {}: {e}", peers[0]);
            return Vec::new();
        }
    };
    if let Some(bytes) = shared {
        return holders.into_iter().filter_map(|(peer, head)| assembled(s, peer, head, &bytes)).collect();
    }
    let alone = holders.into_iter().map(|(peer, head)| async move {
        match fetch::shared_state(s.net, &[peer], run_id, &head, |_, _| {}).await {
            Ok(shared) => assembled(s, peer, head, &shared.bytes),
            Err(e) => {
                if matches!(e, fetch::FetchError::BadChunk | fetch::FetchError::State(_)) {
                    s.refused.get_or_create(&ReasonLabel { reason: "invalid".into() }).inc();
                }
                tracing::warn!("no replica state from {peer}: {e}");
                None
            }
        }
    });
    futures::future::join_all(alone).await.into_iter().flatten().collect()
}

/// `peer`'s state from its head and the shared bytes it names (a head that
/// does not fit them is refused, counted as `invalid`).
fn assembled(s: &EngineSetup<'_>, peer: PeerId, head: StateHead, shared: &[u8]) -> Option<(PeerId, ReplicaState)> {
    match state_transfer::assemble(head, shared) {
        Ok(state) => Some((peer, state)),
        Err(e) => {
            s.refused.get_or_create(&ReasonLabel { reason: "invalid".into() }).inc();
            tracing::warn!("replica state from {peer} refused: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_keeps_the_peers_that_served_and_adds_those_never_asked() {
        let peer = |_| PeerId::random();
        let (honest, late) = (peer(0), peer(1));
        let mut others: Vec<PeerId> = (0..5).map(peer).collect();
        others.sort();
        // Settle saw one honest holder; five peers subscribed since (their
        // ids may all sort below its): it keeps its place and four new
        // peers fill the rest.
        let mut ever: BTreeSet<PeerId> = asked(&[honest]);
        let subscribed: Vec<PeerId> = others.iter().rev().chain([&honest]).copied().collect();
        let next = next_sources(&[honest], subscribed.clone(), &[honest], &ever);
        assert_eq!(next[0], honest);
        assert_eq!(next[1..4], others[..3]);
        assert!(asks_someone_new(&next, &ever));
        // Asked, they served nothing: the one left is next, then nobody new.
        ever.extend(asked(&next));
        let next = next_sources(&[honest], subscribed.clone(), &[honest], &ever);
        assert_eq!(next[..2], [honest, others[3]]);
        assert!(asks_someone_new(&next, &ever));
        ever.extend(asked(&next));
        assert!(!asks_someone_new(&next_sources(&[honest], subscribed, &[honest], &ever), &ever));
        // Two that disagreed (a poisoner and an honest peer): both again,
        // with the peer that subscribed after settle ended.
        let poisoner = peer(2);
        let ever = asked(&[poisoner, honest]);
        let next = next_sources(&[poisoner, honest], vec![late, honest, poisoner], &[poisoner, honest], &ever);
        assert_eq!(next, vec![poisoner, honest, late]);
        assert!(asks_someone_new(&next, &ever));
        // The network says nothing: those that served, then the rest.
        let next = next_sources(&[honest], Vec::new(), &[poisoner, honest], &asked(&[poisoner, honest]));
        assert_eq!(next, vec![honest, poisoner]);
    }

    #[test]
    fn a_second_node_gets_its_own_state_directory() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("state");
        let a = StateDir::lock(&base, true).unwrap();
        let b = StateDir::lock(&base, true).unwrap();
        assert_ne!(a.path, b.path);
        assert!(StateDir::lock(&base, false).is_err());
        drop(a);
        assert_eq!(StateDir::lock(&base, false).unwrap().path, base);
    }
}
