//! `pgwal`: stream PostgreSQL logical changes as JSON lines, receive physical WAL, manage slots.

mod config_file;
mod exit_code;
mod json;
mod kafka_metrics;
mod kafka_sink;
mod metrics;
mod receive_cmd;
mod signals;
mod slot_cmd;
mod slot_watch;
mod snapshot_cmd;
mod stream_cmd;

use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// Stream PostgreSQL logical replication changes (pgoutput) as JSON lines,
/// or physical WAL into segment files.
#[derive(Parser, Debug)]
#[command(name = "pgwal", version, about, long_about = None)]
struct Cli {
    /// Connection string: a URI (postgresql://user@host/db) or key=value pairs.
    /// Unset options come from PGHOST, PGPORT, PGUSER, PGPASSWORD,
    /// PGDATABASE, PGSSLMODE and ~/.pgpass.
    #[arg(
        short = 'd',
        long = "dbname",
        global = true,
        env = "PGWAL_CONNINFO",
        default_value = ""
    )]
    conninfo: String,

    /// Read options from a TOML file: keys are the long option names
    /// (`slot = "app"`, `publication = ["a", "b"]`, `two_phase = true`,
    /// `dbname = "..."`); options on the command line override it.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Stream changes as JSON lines on stdout, one transaction framed by its
    /// begin and commit lines; positions are acknowledged only after the
    /// output was written and flushed, or with `--acks stdin` only once the
    /// consumer wrote them back on stdin.
    Stream(Box<stream_cmd::StreamArgs>),
    #[command(about = receive_cmd::ABOUT, long_about = receive_cmd::LONG_ABOUT)]
    Receive(receive_cmd::ReceiveArgs),
    /// Manage logical replication slots.
    #[command(subcommand)]
    Slot(SlotCommand),
    /// Ask `pgwal stream --sink kafka` on this database to snapshot tables
    /// while it streams: sends the signal (a transactional logical message)
    /// and prints its position as JSON. The sink writes the tables' rows as
    /// read records, exactly once, once the stream reaches the signal.
    Snapshot(SnapshotArgs),
}

#[derive(Args, Debug)]
struct SnapshotArgs {
    /// A published table, schema.table (repeatable).
    #[arg(long = "table", value_name = "TABLE", required = true)]
    tables: Vec<String>,
    /// Only the sink streaming from this slot acts on the signal (every
    /// sink on the database sees it; without this, every one snapshots).
    #[arg(long = "slot", value_name = "SLOT")]
    slot: Option<String>,
}

#[derive(Subcommand, Debug)]
enum SlotCommand {
    /// Create a logical slot using pgoutput; prints its consistent point.
    Create(SlotCreateArgs),
    /// Drop a slot.
    Drop(SlotDropArgs),
    /// List the replication slots of the server with their health: lag
    /// behind the server's WAL, WAL status, invalidation (JSON lines, or a
    /// table).
    List(SlotListArgs),
}

#[derive(Args, Debug)]
struct SlotCreateArgs {
    /// Slot name (lower-case letters, digits, underscores).
    name: String,
    /// Decode prepared transactions at PREPARE time.
    #[arg(long)]
    two_phase: bool,
    /// Mark the slot for failover to standbys (PostgreSQL 17+).
    #[arg(long)]
    failover: bool,
}

#[derive(Args, Debug)]
struct SlotListArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "json")]
    format: slot_cmd::ListFormat,
}

#[derive(Args, Debug)]
struct SlotDropArgs {
    /// Slot name.
    name: String,
    /// Wait for the slot to become inactive instead of failing.
    #[arg(long)]
    wait: bool,
}

fn main() -> ExitCode {
    // info by default (where a stream starts, retries and their next try,
    // snapshot progress); PGWAL_LOG takes a tracing filter ("debug",
    // "pgwal_kafka=debug,librdkafka=warn"); PGWAL_LOG_FORMAT=json writes one
    // JSON object a line for a log collector
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("PGWAL_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    let log = tracing_subscriber::fmt().with_writer(std::io::stderr);
    match std::env::var("PGWAL_LOG_FORMAT").as_deref() {
        Ok("json") => log
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_env_filter(filter())
            .init(),
        Ok("text") | Err(std::env::VarError::NotPresent) => log
            .with_env_filter(filter())
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        Ok(other) => {
            eprintln!("pgwal: PGWAL_LOG_FORMAT={other:?}: expected \"text\" or \"json\"");
            return ExitCode::from(exit_code::CONFIG);
        }
        Err(std::env::VarError::NotUnicode(v)) => {
            eprintln!("pgwal: PGWAL_LOG_FORMAT={v:?}: expected \"text\" or \"json\"");
            return ExitCode::from(exit_code::CONFIG);
        }
    }
    // --config is expanded into options before clap sees them, so a file
    // gets the command line's validation and messages
    let args = match config_file::expand(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pgwal: {e}");
            return ExitCode::from(exit_code::CONFIG);
        }
    };
    // an option given twice (file, then command line) takes the last value
    fn override_self(c: clap::Command) -> clap::Command {
        c.args_override_self(true).mut_subcommands(override_self)
    }
    let cli = match override_self(Cli::command())
        .try_get_matches_from(args)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let Command::Stream(a) = &cli.command {
        if let Some(why) = a.conflict() {
            Cli::command()
                .error(clap::error::ErrorKind::ArgumentConflict, why)
                .exit();
        }
    }
    // `stream --threads N` (N > 1) runs on a multi-thread runtime; everything
    // else on one thread (`receive`'s inline file I/O was measured there).
    let mut builder = match &cli.command {
        Command::Stream(a) if a.threads > 1 => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(usize::from(a.threads));
            b
        }
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pgwal: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let config = pgwal::Config::parse(&cli.conninfo)?;
        let r = match cli.command {
            Command::Stream(a) => return stream_cmd::run(config, *a).await,
            Command::Receive(a) => receive_cmd::run(config, a).await,
            Command::Slot(SlotCommand::Create(a)) => {
                slot_cmd::create(config, &a.name, a.two_phase, a.failover).await
            }
            Command::Slot(SlotCommand::Drop(a)) => slot_cmd::drop(config, &a.name, a.wait).await,
            Command::Slot(SlotCommand::List(a)) => slot_cmd::list(config, a.format).await,
            Command::Snapshot(a) => snapshot_cmd::run(config, &a.tables, a.slot.as_deref()).await,
        };
        r.map_err(Into::into)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pgwal: {e}");
            // by class: a supervisor restarts only what a restart may cure
            exit_code::of(e.as_ref())
        }
    }
}
