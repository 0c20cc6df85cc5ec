//! The fleet backend: one PostgreSQL database shared by every replica of an
//! edge (`tuna-operator edge --store postgres://USER[:PASSWORD]@HOST:PORT/DB`).
//!
//! # Design
//!
//! Every replica keeps the whole state in its mirror, as with redb, and the
//! API keeps today's semantics exactly: a commit decides on a state that
//! holds every change committed before it, fleet-wide, and is durable before
//! it answers. A commit, in one `READ COMMITTED` transaction:
//!
//! 1. takes the fleet-wide write lock, a row lock on the one row of
//!    `store_head` (`SELECT seq FROM store_head WHERE id = 1 FOR UPDATE`);
//! 2. applies to the mirror the changes other replicas committed since the
//!    mirror's sequence number, read from the change log `store_changes`;
//! 3. runs `decide` on that fresh mirror;
//! 4. writes the rows of the typed tables, appends the commit's writes to the
//!    change log under `seq + 1`, bumps `store_head.seq`, and
//!    `pg_notify('tuna_store', seq)`, pipelined, then `COMMIT`s;
//! 5. applies the writes to the mirror.
//!
//! Why a row lock and not an advisory lock: `SELECT … FOR UPDATE` is
//! portable to CockroachDB and YugabyteDB, whose advisory locks are absent
//! or no-ops; and the lock is released by `COMMIT`/`ROLLBACK` or by the
//! session's end, so a replica that dies mid-commit blocks nobody. Why one
//! global lock and not per-name locks: the decisions span kinds (quotas
//! count an account's objects, a free port is chosen by looking at all of
//! them, revoking a key deletes its tokens), and writes are rare next to
//! reads, which never touch the database. Its cost is measured in
//! `benches/README.md` (reservations/s).
//!
//! Other replicas learn of a commit without committing themselves: each
//! `LISTEN`s on `tuna_store` on a dedicated connection (notifications come
//! only from `Connection::poll_message`, so a task drives it), and after a
//! (re)connect `LISTEN`s first and re-reads afterwards (PostgreSQL's `LISTEN`
//! page gives this order: nothing committed in between is missed). A
//! notification is only a wake-up: the change log is the truth, and every
//! replica also polls `store_head.seq` every [`POLL_INTERVAL`], so a lost
//! notification (a dropped listener connection, a store without
//! `LISTEN/NOTIFY` such as CockroachDB) delays a change by at most that.
//! A revocation committed on replica A is therefore in replica B's mirror
//! within a round trip of the notification, and well within one second
//! without it.
//!
//! Reads that must see every acknowledged write (the REST API before each
//! request; deletes and revocations before they look the object up; a
//! tunnel token or binding this copy does not know) first call
//! [`Backend::sync`]: one `SELECT seq FROM store_head`, and a catch-up only
//! when it moved.
//!
//! The change log keeps the last [`CHANGE_LOG_KEEP`] commits; a replica
//! further behind (or one whose log rows were pruned) reloads every table in
//! one `REPEATABLE READ` snapshot instead, and hears what disappeared as
//! deletions.
//!
//! # Schema
//!
//! Typed tables, one per kind (`api_keys`, `domains`, `domain_claims`,
//! `tcp_endpoints`, `tunnel_tokens`, `gateway_addresses`), rather than one
//! table of JSON blobs: the database itself then enforces the uniqueness the API promises
//! (`domains.name`, `(domain_claims.name, account)`, `tcp_endpoints.alias`
//! and `.port`, the ids and the secret hashes) as defence in depth behind
//! the lock, an operator can read and repair them with `psql`, and
//! listing/lookup by column stays possible for a later version that reads
//! without a mirror. The nested values without a fixed shape (a token's
//! labels and bindings) are `jsonb`. The change log's entries are the
//! store's `Write`s as JSON: they are replayed into mirrors, never queried.
//!
//! Migrations are numbered and recorded in `schema_migrations`. Each runs in
//! its own transaction, which first inserts its version there (`ON CONFLICT
//! DO NOTHING`): the primary key is the lock, so a second replica starting at
//! the same moment waits for the first's commit, then inserts nothing and
//! skips the migration; if the first rolled back, the second applies it.
//! That too is portable (no advisory lock, no `LOCK TABLE`).
//!
//! # Failures
//!
//! A store that cannot be reached at start is an error naming it (without
//! its password). While running, a commit that cannot reach it, or that the
//! server aborts for a transient reason (serialisation failure, shutdown,
//! too many connections), fails with [`Error::StoreUnavailable`]: the
//! API answers `503 store_unavailable` with `Retry-After`, nothing is
//! acknowledged, and reads keep answering from the mirror. A commit whose
//! `COMMIT` was sent but not answered may have happened; the next catch-up
//! brings it into the mirror from the change log, so an acknowledged write is
//! never lost and an unacknowledged one is either fully there or absent.
//!
//! The connection takes libpq's `sslmode` and `sslrootcert` from the URL
//! (`super::pg_tls`): `sslmode=verify-full&sslrootcert=ca.pem` is what a
//! fleet whose database is on another machine should use.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::try_join_all;
use tokio::runtime::Runtime;
use tokio::sync::{Mutex, Notify};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::ToSql;
use tokio_postgres::{
    AsyncMessage, Client, Config, Connection, GenericClient, IsolationLevel, Row, Socket,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::pg_tls::{self, SslMode};

use super::model::{
    AddressRecord, Backend, DomainRecord, KeyRecord, Mirror, State, TcpRecord, TokenRecord, Write,
};
use crate::error::{Error, Result};

/// How often every replica looks for changes when no notification came.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Commits kept in the change log (older ones are pruned).
pub const CHANGE_LOG_KEEP: i64 = 10_000;

/// The `NOTIFY` channel commits are announced on.
const CHANNEL: &str = "tuna_store";

/// How long connecting may take before the store counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The server ends a session of ours idle inside a transaction this long.
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(15);

/// A write waits this long for the fleet-wide lock.
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// One statement runs this long at most.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(15);

/// A whole commit or catch-up, client side: beyond it the connection is
/// dropped (a network that swallows packets answers no statement timeout).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Delay between attempts to re-establish the listener connection.
const RELISTEN_BACKOFF: Duration = Duration::from_millis(500);

/// The schema, by version. Append only: a released migration never changes.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "typed tables, head sequence and change log",
        r#"
CREATE TABLE store_head (
    id integer PRIMARY KEY CHECK (id = 1),
    seq bigint NOT NULL
);
INSERT INTO store_head (id, seq) VALUES (1, 0);
CREATE TABLE store_changes (
    seq bigint PRIMARY KEY,
    writes jsonb NOT NULL
);
CREATE TABLE api_keys (
    id text PRIMARY KEY,
    name text,
    account text NOT NULL,
    scopes text[] NOT NULL,
    hash text NOT NULL UNIQUE,
    created_at bigint NOT NULL
);
CREATE TABLE domains (
    name text PRIMARY KEY,
    kind text NOT NULL,
    account text NOT NULL,
    challenge text NOT NULL,
    created_at bigint NOT NULL,
    verified_at bigint,
    verification_message text
);
CREATE TABLE domain_claims (
    name text NOT NULL,
    account text NOT NULL,
    kind text NOT NULL,
    challenge text NOT NULL,
    created_at bigint NOT NULL,
    verified_at bigint,
    verification_message text,
    PRIMARY KEY (name, account)
);
CREATE TABLE tcp_endpoints (
    alias text PRIMARY KEY,
    port integer NOT NULL UNIQUE CHECK (port BETWEEN 1 AND 65535),
    account text NOT NULL,
    created_at bigint NOT NULL
);
CREATE TABLE tunnel_tokens (
    id text PRIMARY KEY,
    hash text NOT NULL UNIQUE,
    account text NOT NULL,
    labels jsonb NOT NULL,
    bindings jsonb NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint NOT NULL,
    minted_by text
);
"#,
    ),
    (
        2,
        "edge attachments with leases (outside the change log)",
        r#"
CREATE TABLE edge_attachments (
    replica text PRIMARY KEY,
    peer_addr text NOT NULL,
    hosts text[] NOT NULL,
    ports integer[] NOT NULL,
    expires_at timestamptz NOT NULL
);
"#,
    ),
    (
        3,
        "reserved Gateway addresses",
        r#"
CREATE TABLE gateway_addresses (
    address text PRIMARY KEY,
    name text NOT NULL,
    account text NOT NULL,
    created_at bigint NOT NULL
);
"#,
    ),
];

/// A connection to the store as tokio-postgres drives it.
pub(crate) type StoreConnection =
    Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// Where the store is and how its connection is secured.
#[derive(Clone)]
pub(crate) struct StoreTarget {
    pub(crate) pg: Config,
    tls: MakeRustlsConnect,
    mode: SslMode,
}

impl StoreTarget {
    /// Opens a connection (TLS as the URL's `sslmode` says).
    pub(crate) async fn connect(&self) -> Result<(Client, StoreConnection), tokio_postgres::Error> {
        self.pg.connect(self.tls.clone()).await
    }

    /// Says once, at start, when the connection is open to an attacker on
    /// the path to a database on another machine.
    fn report_exposure(&self, store: &str) {
        if let Some(why) = pg_tls::exposure(self.mode, self.pg.get_hosts()) {
            tracing::warn!(
                %store,
                "the store's connection can be read or changed on its way: {why}; use \
                 sslmode=verify-full&sslrootcert=CA.pem (docs/edge-fleet.md)"
            );
        }
    }
}

/// A PostgreSQL connection URL, e.g. `postgres://edge:secret@db:5432/tuna`.
/// Its `Debug` and `Display` never show the password; the text is checked
/// when the store opens (not while parsing flags, whose errors would echo
/// it).
#[derive(Clone)]
pub struct StoreUrl {
    text: String,
    /// `--store-insecure-tls`: `sslmode=prefer`/`disable` to a database on
    /// another machine is allowed (and warned about) instead of refused.
    insecure_tls: bool,
}

impl FromStr for StoreUrl {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(Self {
            text: s.to_owned(),
            insecure_tls: false,
        })
    }
}

impl StoreUrl {
    /// The connection settings, or a [`Error::ControlConfig`] that does not
    /// quote the text.
    /// The same URL, allowed to use `sslmode=prefer` or `disable` to a
    /// database on another machine (`--store-insecure-tls`).
    pub fn allowing_insecure_tls(mut self, allow: bool) -> Self {
        self.insecure_tls = allow;
        self
    }

    pub(crate) fn config(&self) -> Result<StoreTarget> {
        let text = self.text.trim();
        if !(text.starts_with("postgres://") || text.starts_with("postgresql://")) {
            return Err(Error::ControlConfig(
                "--store takes a postgres://USER[:PASSWORD]@HOST:PORT/DB URL".into(),
            ));
        }
        let tls = pg_tls::split_url(text)?;
        let mut config = Config::from_str(&tls.rest).map_err(|e| {
            Error::ControlConfig(format!(
                "the --store URL does not parse ({e}); it is not shown, as it may hold a password"
            ))
        })?;
        if config.get_dbname().is_none() || config.get_user().is_none() {
            return Err(Error::ControlConfig(
                "the --store URL must name a user and a database: postgres://USER[:PASSWORD]@HOST:PORT/DB".into(),
            ));
        }
        if matches!(tls.mode, pg_tls::SslMode::Prefer | pg_tls::SslMode::Disable)
            && !self.insecure_tls
            && let Some(why) = pg_tls::exposure(tls.mode, config.get_hosts())
        {
            return Err(Error::ControlConfig(format!(
                "refusing the --store URL's sslmode={} to a database on another machine: {why},                  and an attacker on the path could read or change what every replica trusts;                  use sslmode=verify-full&sslrootcert=CA.pem (docs/edge-fleet.md), or pass                  --store-insecure-tls to accept that",
                tls.mode.name()
            )));
        }
        config
            .connect_timeout(CONNECT_TIMEOUT)
            .application_name("tuna-edge")
            .ssl_mode(pg_tls::negotiation(tls.mode));
        Ok(StoreTarget {
            tls: pg_tls::connector(&tls)?,
            mode: tls.mode,
            pg: config,
        })
    }

    /// `postgres://user@host:port/db`, without the password.
    pub fn redacted(&self) -> String {
        let Ok(config) = pg_tls::split_url(self.text.trim())
            .map_err(|_| ())
            .and_then(|tls| Config::from_str(&tls.rest).map_err(|_| ()))
        else {
            return "<an unparseable --store URL>".to_owned();
        };
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let host = match host {
                    tokio_postgres::config::Host::Tcp(name) => name.clone(),
                    tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                };
                match config.get_ports().get(i).or(config.get_ports().first()) {
                    Some(port) => format!("{host}:{port}"),
                    None => host,
                }
            })
            .collect();
        format!(
            "postgres://{}{}@{}/{}",
            config.get_user().unwrap_or(""),
            if config.get_password().is_some() {
                ":***"
            } else {
                ""
            },
            hosts.join(","),
            config.get_dbname().unwrap_or("")
        )
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreUrl").field(&self.redacted()).finish()
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// The PostgreSQL backend. See the module docs.
pub(crate) struct Postgres {
    /// The store's own runtime: commits come from blocking threads (and the
    /// `edge keys` command, which has none), the listener and the poller
    /// live here. `None` only while dropping.
    runtime: Option<Runtime>,
    shared: Arc<Shared>,
}

struct Shared {
    config: StoreTarget,
    /// The URL without its password, for errors and logs.
    name: String,
    mirror: Arc<Mirror>,
    /// This process's writers and catch-ups, one at a time.
    writer: Mutex<Writer>,
    /// Woken by a notification, and after the listener (re)connects.
    changed: Notify,
    /// When the last read that found the mirror caught up was sent (after
    /// any wait for the writer): the mirror holds every commit made before
    /// then. Waiting in a queue does not age it; only the store not
    /// answering does.
    fresh_at: parking_lot::Mutex<std::time::Instant>,
    /// Catch-ups ([`Shared::sync`]) one at a time: a caller that finds a read
    /// sent after its call already completed needs no round trip of its
    /// own, so however many callers wait, at most one catch-up is in flight
    /// and one more follows it.
    sync_gate: Mutex<()>,
}

struct Writer {
    /// Connected lazily again after a failure.
    client: Option<Client>,
    /// The last commit the mirror holds (`store_head.seq` then).
    seq: i64,
    /// Whether the last catch-up failed (to log an outage once).
    failing: bool,
}

impl Postgres {
    /// Connects, applies the migrations, loads the state into `mirror`, and
    /// starts following other replicas' commits. Blocks; not on an async
    /// runtime's thread.
    pub(crate) fn open(url: &StoreUrl, mirror: Arc<Mirror>) -> Result<Self> {
        let config = url.config()?;
        let name = url.redacted();
        config.report_exposure(&name);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tuna-store")
            .enable_all()
            .build()
            .map_err(|source| Error::File {
                path: "<the store's runtime>".into(),
                source,
            })?;
        let (client, seq) = runtime.block_on(async {
            let mut client = connect(&config)
                .await
                .map_err(|source| Error::StoreUnreachable {
                    store: name.clone(),
                    source,
                })?;
            migrate(&mut client, &name).await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(classify(&name, "loading"))?;
            let (state, seq) = load_all(&tx, &name).await?;
            tx.commit().await.map_err(classify(&name, "loading"))?;
            mirror.replace(state);
            Ok::<_, Error>((client, seq))
        })?;
        let shared = Arc::new(Shared {
            config,
            name,
            mirror,
            writer: Mutex::new(Writer {
                client: Some(client),
                seq,
                failing: false,
            }),
            changed: Notify::new(),
            fresh_at: parking_lot::Mutex::new(std::time::Instant::now()),
            sync_gate: Mutex::new(()),
        });
        runtime.spawn(listen(Arc::clone(&shared)));
        runtime.spawn(poll(Arc::clone(&shared)));
        Ok(Self {
            runtime: Some(runtime),
            shared,
        })
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics on an async thread; its
        // tasks only listen and poll, so stop them without waiting.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Backend for Postgres {
    fn describe(&self) -> String {
        format!("PostgreSQL {}", self.shared.name)
    }

    fn staleness(&self) -> Duration {
        self.shared.fresh_at.lock().elapsed()
    }

    fn sync(&self) -> Result<()> {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| Error::Internal("the store is closing".into()))?;
        let called = std::time::Instant::now();
        runtime.block_on(Arc::clone(&self.shared).sync(called))
    }

    fn sync_async(&self) -> futures::future::BoxFuture<'static, Result<()>> {
        let Some(runtime) = self.runtime.as_ref() else {
            return Box::pin(std::future::ready(Err(Error::Internal(
                "the store is closing".into(),
            ))));
        };
        // Spawned on the store's runtime (its connections live there),
        // awaited from the caller's, and aborted when the caller goes away
        // (an HTTP/2 stream reset drops the request's future): no catch-up
        // outlives the request that asked for it.
        let called = std::time::Instant::now();
        let task = AbortOnDrop(runtime.spawn(Arc::clone(&self.shared).sync(called)));
        Box::pin(async move {
            task.await
                .map_err(|e| Error::Internal(format!("catching up did not finish: {e}")))?
        })
    }

    fn commit(
        &self,
        mirror: &Mirror,
        decide: &mut dyn FnMut(&State) -> Result<Vec<Write>>,
    ) -> Result<()> {
        debug_assert!(std::ptr::eq(mirror, Arc::as_ptr(&self.shared.mirror)));
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| Error::Internal("the store is closing".into()))?;
        runtime.block_on(async {
            match tokio::time::timeout(OPERATION_TIMEOUT, self.shared.commit(decide)).await {
                Ok(result) => result,
                Err(_) => Err(self.shared.timed_out("writing").await),
            }
        })
    }
}

impl Shared {
    async fn commit(&self, decide: &mut dyn FnMut(&State) -> Result<Vec<Write>>) -> Result<()> {
        let mut writer = self.writer.lock().await;
        let Writer { client, seq, .. } = &mut *writer;
        let client = self.client(client).await?;
        let name = self.name.as_str();
        let began = std::time::Instant::now();
        let tx = client
            .transaction()
            .await
            .map_err(classify(name, "beginning a write"))?;
        // The fleet-wide write lock, held until COMMIT or ROLLBACK.
        let head: i64 = tx
            .query_one("SELECT seq FROM store_head WHERE id = 1 FOR UPDATE", &[])
            .await
            .map_err(classify(name, "locking the store"))?
            .get(0);
        catch_up(&tx, seq, head, &self.mirror, name).await?;
        self.fresh(began);
        let writes = decide(&self.mirror.read())?;
        if writes.is_empty() {
            // Dropping the transaction rolls it back (and frees the lock).
            return Ok(());
        }
        let next = head + 1;
        persist(&tx, next, &writes, name).await?;
        tx.commit().await.map_err(classify(name, "committing"))?;
        *seq = next;
        self.mirror.apply(writes);
        Ok(())
    }

    /// Brings the mirror up to the store's head (the poller's and the
    /// listener's job), in one snapshot.
    async fn refresh(&self) -> Result<()> {
        let mut writer = self.writer.lock().await;
        let mut began = std::time::Instant::now();
        let result = async {
            let Writer { client, seq, .. } = &mut *writer;
            let client = self.client(client).await?;
            let name = self.name.as_str();
            began = std::time::Instant::now();
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(classify(name, "reading changes"))?;
            let head: i64 = tx
                .query_one("SELECT seq FROM store_head WHERE id = 1", &[])
                .await
                .map_err(classify(name, "reading changes"))?
                .get(0);
            catch_up(&tx, seq, head, &self.mirror, name).await?;
            tx.commit().await.map_err(classify(name, "reading changes"))
        }
        .await;
        if result.is_ok() {
            self.fresh(began);
        }
        match (&result, writer.failing) {
            (Err(e), false) => {
                tracing::warn!(error = %e, "following the store's changes failed; retrying");
                writer.failing = true;
            }
            (Ok(()), true) => {
                tracing::info!(store = %self.name, "following the store's changes again");
                writer.failing = false;
            }
            _ => {}
        }
        result
    }

    /// Records that the mirror held every commit made before `began`.
    fn fresh(&self, began: std::time::Instant) {
        let mut fresh_at = self.fresh_at.lock();
        if began > *fresh_at {
            *fresh_at = began;
        }
    }

    /// Brings the mirror up to every commit made before `called`: nothing
    /// when a read sent since then has completed (the poller's, another
    /// caller's), else one round trip when the head did not move. Callers
    /// queue on [`Shared::sync_gate`], so concurrent ones share reads.
    async fn sync(self: Arc<Self>, called: std::time::Instant) -> Result<()> {
        let _gate = self.sync_gate.lock().await;
        if *self.fresh_at.lock() >= called {
            return Ok(());
        }
        let check = async {
            let mut writer = self.writer.lock().await;
            let Writer { client, seq, .. } = &mut *writer;
            let known = *seq;
            let client = self.client(client).await?;
            let began = std::time::Instant::now();
            let head: i64 = client
                .query_one("SELECT seq FROM store_head WHERE id = 1", &[])
                .await
                .map_err(classify(&self.name, "reading the head"))?
                .get(0);
            if head == known {
                self.fresh(began);
            }
            Ok::<_, Error>(head != known)
        };
        match tokio::time::timeout(OPERATION_TIMEOUT, async {
            if check.await? {
                self.refresh().await?;
            }
            Ok(())
        })
        .await
        {
            Ok(result) => result,
            Err(_) => Err(self.timed_out("reading changes").await),
        }
    }

    /// After an operation timed out: drops the connection (the next
    /// operation reconnects) and says so.
    async fn timed_out(&self, context: &'static str) -> Error {
        self.writer.lock().await.client = None;
        Error::StoreTimedOut {
            store: self.name.clone(),
            context,
            after: OPERATION_TIMEOUT,
        }
    }

    /// The writer's connection, reconnected when it was lost.
    async fn client<'c>(&self, client: &'c mut Option<Client>) -> Result<&'c mut Client> {
        if client.as_ref().is_none_or(Client::is_closed) {
            *client = None;
            let fresh = connect(&self.config)
                .await
                .map_err(classify(&self.name, "connecting"))?;
            *client = Some(fresh);
        }
        Ok(client.as_mut().expect("connected just above"))
    }
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

/// Connects and drives the connection on the current runtime.
///
/// The session's timeouts bound what a replica cut off from the database
/// can hold: the server ends a session idle inside a transaction (a replica
/// that vanished while holding the write lock frees it), a write waits for
/// the lock and a statement runs only so long (the API then answers 503).
async fn connect(config: &StoreTarget) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect().await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "store connection ended");
        }
    });
    client
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = {}; SET lock_timeout = {}; \
             SET statement_timeout = {}",
            IDLE_IN_TRANSACTION.as_millis(),
            LOCK_TIMEOUT.as_millis(),
            STATEMENT_TIMEOUT.as_millis()
        ))
        .await?;
    Ok(client)
}

/// Follows `NOTIFY tuna_store` on a dedicated connection, reconnecting.
async fn listen(shared: Arc<Shared>) {
    loop {
        match shared.config.connect().await {
            Ok((client, mut connection)) => {
                // Notifications arrive only through `poll_message`.
                let drive = async {
                    loop {
                        match futures::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(_))) => shared.changed.notify_one(),
                            Some(Ok(_)) => {}
                            Some(Err(e)) => return Some(e),
                            None => return None,
                        }
                    }
                };
                let subscribe = async {
                    match client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                        Ok(()) => {
                            // LISTEN first, re-read after: nothing committed
                            // while we were away is missed.
                            shared.changed.notify_one();
                            std::future::pending::<Option<tokio_postgres::Error>>().await
                        }
                        Err(e) => Some(e),
                    }
                };
                let ended = tokio::select! {
                    e = drive => e,
                    e = subscribe => e,
                };
                tracing::debug!(error = ?ended.map(|e| e.to_string()), "store listener ended; reconnecting");
            }
            Err(e) => tracing::debug!(error = %e, "store listener cannot connect; retrying"),
        }
        tokio::time::sleep(RELISTEN_BACKOFF).await;
    }
}

/// Catches up on every notification, and every [`POLL_INTERVAL`] anyway.
async fn poll(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shared.changed.notified() => {}
            _ = tick.tick() => {}
        }
        // Failures are logged by `refresh` and retried at the next tick.
        if tokio::time::timeout(OPERATION_TIMEOUT, shared.refresh())
            .await
            .is_err()
        {
            let e = shared.timed_out("reading changes").await;
            tracing::warn!(error = %e, "following the store's changes timed out; reconnecting");
        }
    }
}

/// Applies the commits after `*seq` up to `head` to the mirror, from the
/// change log, or by reloading everything when the log lacks some.
async fn catch_up(
    client: &impl GenericClient,
    seq: &mut i64,
    head: i64,
    mirror: &Mirror,
    name: &str,
) -> Result<()> {
    if head == *seq {
        return Ok(());
    }
    let rows = client
        .query(
            "SELECT seq, writes FROM store_changes WHERE seq > $1 AND seq <= $2 ORDER BY seq",
            &[&*seq, &head],
        )
        .await
        .map_err(classify(name, "reading changes"))?;
    let complete = head > *seq
        && usize::try_from(head - *seq).is_ok_and(|n| n == rows.len())
        && rows.first().map(|r| r.get::<_, i64>(0)) == Some(*seq + 1);
    if complete {
        for row in rows {
            let at: i64 = row.get(0);
            let writes: Vec<Write> = decode(row.get(1), "store_changes", &at)?;
            mirror.apply_remote(writes);
            // Advanced per commit: a failure further on replays nothing twice.
            *seq = at;
        }
    } else {
        // Pruned log rows, or a head behind the mirror (a restored backup):
        // the tables are the truth.
        let (state, _) = load_all(client, name).await?;
        mirror.replace(state);
        tracing::info!(store = %name, from = *seq, to = head, "reloaded the whole store");
    }
    *seq = head;
    Ok(())
}

/// Writes the commit `next`: rows, change log entry, head, notification,
/// sent as one pipeline.
async fn persist(
    tx: &tokio_postgres::Transaction<'_>,
    next: i64,
    writes: &[Write],
    name: &str,
) -> Result<()> {
    let log = serde_json::to_value(writes).expect("writes serialise to JSON");
    let next_text = next.to_string();
    let prune_below = next - CHANGE_LOG_KEEP;
    let rows: Vec<(&str, Vec<Box<dyn ToSql + Sync + Send>>)> =
        writes.iter().map(statement).collect();
    let mut pending = Vec::with_capacity(rows.len() + 4);
    for (sql, params) in &rows {
        let params: Vec<&(dyn ToSql + Sync)> = params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        pending.push(async move { tx.execute(*sql, &params).await });
    }
    let head = async {
        tx.execute(
            "INSERT INTO store_changes (seq, writes) VALUES ($1, $2)",
            &[&next, &log],
        )
        .await?;
        tx.execute("UPDATE store_head SET seq = $1 WHERE id = 1", &[&next])
            .await?;
        if next % 1000 == 0 {
            tx.execute("DELETE FROM store_changes WHERE seq <= $1", &[&prune_below])
                .await?;
        }
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &next_text])
            .await
    };
    // Both sets are polled together, so their statements share the pipeline.
    let (rows, head) = futures::join!(try_join_all(pending), head);
    rows.map_err(classify(name, "writing"))?;
    head.map_err(classify(name, "writing"))?;
    Ok(())
}

/// The statement that makes one write, with its parameters.
fn statement(write: &Write) -> (&'static str, Vec<Box<dyn ToSql + Sync + Send>>) {
    fn text<T: serde::Serialize>(value: &T) -> String {
        match serde_json::to_value(value) {
            Ok(serde_json::Value::String(s)) => s,
            other => unreachable!("enum values serialise to strings, not {other:?}"),
        }
    }
    match write {
        Write::PutKey(r) => (
            "INSERT INTO api_keys (id, name, account, scopes, hash, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO UPDATE SET \
             name = EXCLUDED.name, account = EXCLUDED.account, scopes = EXCLUDED.scopes, \
             hash = EXCLUDED.hash, created_at = EXCLUDED.created_at",
            vec![
                Box::new(r.id.clone()),
                Box::new(r.name.clone()),
                Box::new(r.account.clone()),
                Box::new(r.scopes.iter().map(text).collect::<Vec<String>>()),
                Box::new(r.hash.clone()),
                Box::new(r.created_at),
            ],
        ),
        Write::DeleteKey(id) => (
            "DELETE FROM api_keys WHERE id = $1",
            vec![Box::new(id.clone())],
        ),
        Write::PutDomain(r) => (
            "INSERT INTO domains (name, kind, account, challenge, created_at, verified_at, \
             verification_message) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) \
             DO UPDATE SET kind = EXCLUDED.kind, account = EXCLUDED.account, \
             challenge = EXCLUDED.challenge, created_at = EXCLUDED.created_at, \
             verified_at = EXCLUDED.verified_at, \
             verification_message = EXCLUDED.verification_message",
            domain_params(r, text(&r.kind)),
        ),
        Write::DeleteDomain(name) => (
            "DELETE FROM domains WHERE name = $1",
            vec![Box::new(name.clone())],
        ),
        Write::PutClaim(r) => (
            "INSERT INTO domain_claims (name, kind, account, challenge, created_at, \
             verified_at, verification_message) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (name, account) DO UPDATE SET kind = EXCLUDED.kind, \
             challenge = EXCLUDED.challenge, created_at = EXCLUDED.created_at, \
             verified_at = EXCLUDED.verified_at, \
             verification_message = EXCLUDED.verification_message",
            domain_params(r, text(&r.kind)),
        ),
        Write::DeleteClaim(name, account) => (
            "DELETE FROM domain_claims WHERE name = $1 AND account = $2",
            vec![Box::new(name.clone()), Box::new(account.clone())],
        ),
        Write::PutTcp(r) => (
            "INSERT INTO tcp_endpoints (alias, port, account, created_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (alias) DO UPDATE SET \
             port = EXCLUDED.port, account = EXCLUDED.account, created_at = EXCLUDED.created_at",
            vec![
                Box::new(r.alias.clone()),
                Box::new(i32::from(r.port)),
                Box::new(r.account.clone()),
                Box::new(r.created_at),
            ],
        ),
        Write::DeleteTcp(alias) => (
            "DELETE FROM tcp_endpoints WHERE alias = $1",
            vec![Box::new(alias.clone())],
        ),
        Write::PutToken(r) => (
            "INSERT INTO tunnel_tokens (id, hash, account, labels, bindings, created_at, \
             expires_at, minted_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (id) DO UPDATE SET hash = EXCLUDED.hash, account = EXCLUDED.account, \
             labels = EXCLUDED.labels, bindings = EXCLUDED.bindings, \
             created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, \
             minted_by = EXCLUDED.minted_by",
            vec![
                Box::new(r.id.clone()),
                Box::new(r.hash.clone()),
                Box::new(r.account.clone()),
                Box::new(serde_json::to_value(&r.labels).expect("labels serialise")),
                Box::new(serde_json::to_value(&r.bindings).expect("bindings serialise")),
                Box::new(r.created_at),
                Box::new(r.expires_at),
                Box::new(r.minted_by.clone()),
            ],
        ),
        Write::DeleteToken(id) => (
            "DELETE FROM tunnel_tokens WHERE id = $1",
            vec![Box::new(id.clone())],
        ),
        Write::PutAddress(r) => (
            "INSERT INTO gateway_addresses (address, name, account, created_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (address) DO UPDATE SET \
             name = EXCLUDED.name, account = EXCLUDED.account, created_at = EXCLUDED.created_at",
            vec![
                Box::new(r.address.to_string()),
                Box::new(r.name.clone()),
                Box::new(r.account.clone()),
                Box::new(r.created_at),
            ],
        ),
        Write::DeleteAddress(address) => (
            "DELETE FROM gateway_addresses WHERE address = $1",
            vec![Box::new(address.to_string())],
        ),
    }
}

fn domain_params(r: &DomainRecord, kind: String) -> Vec<Box<dyn ToSql + Sync + Send>> {
    vec![
        Box::new(r.name.clone()),
        Box::new(kind),
        Box::new(r.account.clone()),
        Box::new(r.challenge.clone()),
        Box::new(r.created_at),
        Box::new(r.verified_at),
        Box::new(r.verification_message.clone()),
    ]
}

/// Every table and the head sequence, read in the caller's snapshot.
async fn load_all(client: &impl GenericClient, name: &str) -> Result<(State, i64)> {
    let fail = classify(name, "loading");
    let head: i64 = client
        .query_one("SELECT seq FROM store_head WHERE id = 1", &[])
        .await
        .map_err(classify(name, "loading"))?
        .get(0);
    let (keys, domains, claims, tcp, tokens, addresses) = futures::try_join!(
        client.query(
            "SELECT id, name, account, scopes, hash, created_at FROM api_keys",
            &[]
        ),
        client.query(
            "SELECT name, kind, account, challenge, created_at, verified_at, \
             verification_message FROM domains",
            &[]
        ),
        client.query(
            "SELECT name, kind, account, challenge, created_at, verified_at, \
             verification_message FROM domain_claims",
            &[]
        ),
        client.query(
            "SELECT alias, port, account, created_at FROM tcp_endpoints",
            &[]
        ),
        client.query(
            "SELECT id, hash, account, labels, bindings, created_at, expires_at, minted_by \
             FROM tunnel_tokens",
            &[]
        ),
        client.query(
            "SELECT address, name, account, created_at FROM gateway_addresses",
            &[]
        ),
    )
    .map_err(fail)?;
    let mut state = State::default();
    for row in keys {
        let id: String = row.get(0);
        let scopes = row
            .get::<_, Vec<String>>(3)
            .into_iter()
            .map(|s| decode(serde_json::Value::String(s), "api_keys", &id))
            .collect::<Result<_>>()?;
        let record = KeyRecord {
            id: id.clone(),
            name: row.get(1),
            account: row.get(2),
            scopes,
            hash: row.get(4),
            created_at: row.get(5),
        };
        state.keys.insert(id, record);
    }
    for row in domains {
        let record = domain_row(&row, "domains")?;
        state.domains.insert(record.name.clone(), record);
    }
    for row in claims {
        let record = domain_row(&row, "domain_claims")?;
        state
            .claims
            .insert((record.name.clone(), record.account.clone()), record);
    }
    for row in tcp {
        let alias: String = row.get(0);
        let port = u16::try_from(row.get::<_, i32>(1)).map_err(|_| Error::CorruptRow {
            table: "tcp_endpoints",
            key: alias.clone(),
            message: "port out of range".into(),
        })?;
        let record = TcpRecord {
            alias: alias.clone(),
            port,
            account: row.get(2),
            created_at: row.get(3),
        };
        state.tcp.insert(alias, record);
    }
    for row in tokens {
        let id: String = row.get(0);
        let record = TokenRecord {
            id: id.clone(),
            hash: row.get(1),
            account: row.get(2),
            labels: decode(row.get(3), "tunnel_tokens", &id)?,
            bindings: decode(row.get(4), "tunnel_tokens", &id)?,
            created_at: row.get(5),
            expires_at: row.get(6),
            minted_by: row.get(7),
        };
        state.tokens.insert(id, record);
    }
    for row in addresses {
        let text: String = row.get(0);
        let address = text
            .parse::<std::net::IpAddr>()
            .map_err(|_| Error::CorruptRow {
                table: "gateway_addresses",
                key: text.clone(),
                message: "not an IP address".into(),
            })?;
        let record = AddressRecord {
            address,
            name: row.get(1),
            account: row.get(2),
            created_at: row.get(3),
        };
        state.addresses.insert(address, record);
    }
    Ok((state, head))
}

fn domain_row(row: &Row, table: &'static str) -> Result<DomainRecord> {
    let name: String = row.get(0);
    Ok(DomainRecord {
        kind: decode(serde_json::Value::String(row.get(1)), table, &name)?,
        name,
        account: row.get(2),
        challenge: row.get(3),
        created_at: row.get(4),
        verified_at: row.get(5),
        verification_message: row.get(6),
    })
}

fn decode<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    table: &'static str,
    key: &dyn fmt::Display,
) -> Result<T> {
    serde_json::from_value(value).map_err(|e| Error::CorruptRow {
        table,
        key: key.to_string(),
        message: e.to_string(),
    })
}

/// Applies the migrations this version knows and the database lacks.
async fn migrate(client: &mut Client, name: &str) -> Result<()> {
    // Two replicas creating the table at once may collide in the catalog
    // even with IF NOT EXISTS (23505 on pg_type's index, 42P07 duplicate
    // table, 42710 duplicate type: all seen here): the loser retries and
    // then finds it.
    let mut attempts = 0;
    loop {
        let created = client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                     version integer PRIMARY KEY,
                     description text NOT NULL,
                     applied_at timestamptz NOT NULL DEFAULT now()
                 )",
            )
            .await;
        match created {
            Ok(()) => break,
            Err(e)
                if attempts < 5
                    && matches!(
                        e.code(),
                        Some(&SqlState::UNIQUE_VIOLATION)
                            | Some(&SqlState::DUPLICATE_TABLE)
                            | Some(&SqlState::DUPLICATE_OBJECT)
                    ) =>
            {
                attempts += 1;
            }
            Err(e) => return Err(classify(name, "creating schema_migrations")(e)),
        }
    }
    for (version, description, sql) in MIGRATIONS {
        let tx = client
            .transaction()
            .await
            .map_err(classify(name, "migrating"))?;
        // The primary key is the lock: a concurrent replica's insert of the
        // same version waits for this transaction, then inserts nothing.
        let claimed = tx
            .execute(
                "INSERT INTO schema_migrations (version, description) VALUES ($1, $2) \
                 ON CONFLICT (version) DO NOTHING",
                &[version, description],
            )
            .await
            .map_err(classify(name, "migrating"))?;
        if claimed == 0 {
            continue;
        }
        tx.batch_execute(sql)
            .await
            .map_err(classify(name, "migrating"))?;
        tx.commit().await.map_err(classify(name, "migrating"))?;
        tracing::info!(store = %name, version, description, "applied a store migration");
    }
    let newest: Option<i32> = client
        .query_one("SELECT max(version) FROM schema_migrations", &[])
        .await
        .map_err(classify(name, "migrating"))?
        .get(0);
    let known = MIGRATIONS.last().map(|m| m.0);
    if newest > known {
        // A newer replica migrated first (a rolling upgrade): its
        // migrations only add, so this version keeps working.
        tracing::warn!(
            store = %name,
            database = ?newest,
            this_version = ?known,
            "the store's schema is newer than this edge; upgrade it"
        );
    }
    Ok(())
}

/// Maps a client error to the API's error classes: unreachable or transient
/// (503, retry) or a refused statement (500).
fn classify<'n>(
    name: &'n str,
    context: &'static str,
) -> impl Fn(tokio_postgres::Error) -> Error + 'n {
    move |source| {
        let transient = match source.code() {
            // No server answer at all: the connection failed or closed.
            None => true,
            Some(code) => {
                let class = &code.code()[..2];
                // 08 connection, 40 rollback (serialisation, deadlock),
                // 53 resources, 55P03 lock timeout, 57 operator intervention
                // (shutdown, statement timeout), 58 I/O.
                matches!(class, "08" | "40" | "53" | "57" | "58")
                    || code == &SqlState::LOCK_NOT_AVAILABLE
            }
        };
        if transient {
            Error::StoreUnavailable {
                store: name.to_owned(),
                context,
                source,
            }
        } else {
            Error::Database {
                store: name.to_owned(),
                context,
                source,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 40, item 5: `sslmode=prefer` (the default) and `disable` to a
    /// database on another machine are refused unless
    /// `--store-insecure-tls` says so; loopback, Unix sockets and verified
    /// modes are not affected.
    #[test]
    fn unverified_sslmodes_to_another_machine_are_refused_unless_allowed() {
        let url = |s: &str| s.parse::<StoreUrl>().unwrap();
        for refused in [
            "postgres://edge:pw@db.internal/tuna",
            "postgres://edge:pw@db.internal/tuna?sslmode=prefer",
            "postgres://edge:pw@10.0.0.5/tuna?sslmode=disable",
        ] {
            let err = url(refused).config().err().expect(refused).to_string();
            assert!(err.contains("--store-insecure-tls"), "{err}");
            assert!(!err.contains("pw"), "the password stays out: {err}");
            assert!(
                url(refused).allowing_insecure_tls(true).config().is_ok(),
                "{refused} with the flag"
            );
        }
        for allowed in [
            "postgres://edge@127.0.0.1/tuna",
            "postgres://edge@localhost/tuna?sslmode=disable",
            "postgres://edge@db.internal/tuna?sslmode=require",
            "postgres://edge@db.internal/tuna?sslmode=verify-full&sslrootcert=system",
        ] {
            assert!(url(allowed).config().is_ok(), "{allowed}");
        }
    }
}
