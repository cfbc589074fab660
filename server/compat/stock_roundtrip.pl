
# Copyright (c) 2026, PostgreSQL Global Development Group

# The patched server is a drop-in for stock PostgreSQL 18: a data directory
# made by the unpatched build of the same source starts on the patched build
# and back again (no catalog version bump, no pg_upgrade), the statistics
# views work on the stock catalog (the patch appends its columns), a data
# directory made by the patched build runs on the stock build (its views
# fail cleanly there), and the
# two builds replicate to each other both ways, so that a patched standby
# never sends a stock primary the receive position it would not understand,
# and a stock standby releases remote_receive commits of a patched primary at
# its write position.  A stock standby of a patched primary that streams
# unflushed WAL cannot follow the primary's timeline switch after a crash:
# the primary warns when it connects, and refuses its request for the
# skipped timeline's history file with a message that says why.
#
# server/pg test builds the unpatched flavour ("stock", .build/install/stock)
# and runs this file with the recovery suite's harness, which puts the patched
# build first in PATH.  PGWAL_STOCK_INSTALL names the stock installation.
use strict;
use warnings FATAL => 'all';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $stock = $ENV{PGWAL_STOCK_INSTALL};
plan skip_all => 'PGWAL_STOCK_INSTALL is not set (server/pg test sets it)'
  unless $stock;
BAIL_OUT("PGWAL_STOCK_INSTALL=$stock has no bin/postgres")
  unless -x "$stock/bin/postgres";
BAIL_OUT("PGWAL_STOCK_INSTALL=$stock is a patched build")
  if -e "$stock/PGWAL-BUILD";

# Run a node on the other build.  Cluster.pm takes the binaries of a node
# from its install path; without one, from PATH (the patched build here).
sub use_build
{
	my ($node, $path) = @_;
	if (defined $path)
	{
		$node->{_install_path} = $path;
	}
	else
	{
		delete $node->{_install_path};
	}
}

# Make $standby_name the synchronous standby of $primary, and wait for it.
sub make_synchronous
{
	my ($primary, $standby_name) = @_;
	$primary->append_conf('postgresql.conf',
		"synchronous_standby_names = '$standby_name'");
	$primary->reload;
	$primary->poll_query_until('postgres', qq[
	SELECT sync_state = 'sync' FROM pg_stat_replication
	WHERE application_name = '$standby_name'])
	  or die "$standby_name did not become synchronous";
}

sub is_patched
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_settings WHERE name = 'commit_early_release'");
}

# --- a stock data directory on the patched build and back ---------------------

my $node = PostgreSQL::Test::Cluster->new('stockdata', install_path => $stock);
# force_initdb: the harness would otherwise copy its initdb template, which
# the patched build made
$node->init(allows_streaming => 1, force_initdb => 1);
$node->start;
is(is_patched($node), '0', 'the data directory is made by the stock build');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_attribute WHERE attrelid = 'pg_stat_replication'::regclass AND attname IN ('receive_lsn', 'send_mode')"
	),
	'0',
	'its catalog is the stock one');
is($node->safe_psql('postgres', 'SHOW data_checksums'),
	'on', 'with data checksums, the default of 18');
$node->safe_psql('postgres', q[
	CREATE TABLE t (id int PRIMARY KEY, note text);
	INSERT INTO t VALUES (1, 'stock');
]);
my $catversion_stock = $node->safe_psql('postgres',
	'SELECT catalog_version_no FROM pg_control_system()');
$node->stop;

use_build($node, undef);
$node->start;
is(is_patched($node), '1', 'the same data directory runs on the patched build');
is( $node->safe_psql(
		'postgres', 'SELECT catalog_version_no FROM pg_control_system()'),
	$catversion_stock,
	'same catalog version');
$node->safe_psql(
	'postgres', q[
	SET synchronous_commit = remote_receive;
	SET commit_early_release = on;
	SET durable_snapshots = on;
	INSERT INTO t VALUES (2, 'patched');
]);
is($node->safe_psql('postgres', 'SELECT string_agg(note, \',\' ORDER BY id) FROM t'),
	'stock,patched', 'data written by both builds');
# The stock catalog asks pg_stat_get_wal_senders()/pg_stat_get_wal_receiver()
# for the stock columns only; the patched functions must fit.
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FROM pg_stat_replication; SELECT count(*) FROM pg_stat_wal_receiver'
	),
	"0\n0",
	'pg_stat_replication and pg_stat_wal_receiver work on the stock catalog');
$node->stop;

use_build($node, $stock);
$node->start;
is(is_patched($node), '0', 'and back on the stock build');
is($node->safe_psql('postgres', 'SELECT string_agg(note, \',\' ORDER BY id) FROM t'),
	'stock,patched', 'the stock build reads what the patched build wrote');

# --- replication between the builds, both ways --------------------------------

# A stock primary with a patched synchronous standby, which would accept
# unflushed WAL from a primary that reports the feature.
$node->append_conf('postgresql.conf', 'log_replication_commands = on');
$node->reload;
$node->safe_psql('postgres', 'CHECKPOINT');
$node->backup('b1');
my $standby = PostgreSQL::Test::Cluster->new('patched_standby');
$standby->init_from_backup($node, 'b1', has_streaming => 1);
use_build($standby, undef);
# debug1 from the start: the walreceiver logs when a primary says it
# understands receive positions, which happens when streaming starts.
$standby->append_conf('postgresql.conf',
	"wal_receiver_reply_events = 'receive, write, flush'\nlog_min_messages = debug1\nwal_receiver_accept_unflushed = on");
$standby->start;
is(is_patched($standby), '1', 'the standby runs the patched build');
make_synchronous($node, 'patched_standby');
$node->safe_psql('postgres',
	"SET synchronous_commit = remote_write; INSERT INTO t VALUES (3, 'to patched')");
$node->safe_psql('postgres',
	"SET synchronous_commit = on; INSERT INTO t VALUES (4, 'to patched, on')");
$node->wait_for_replay_catchup($standby);
is($standby->safe_psql('postgres', 'SELECT count(*) FROM t'),
	'4', 'a stock primary replicates to a patched synchronous standby');
# Status updates without the receive position, which a stock primary never
# asks for: had the standby appended it, this PostgreSQL 18 primary would
# still accept it, so check the standby's own debug output.
unlike(slurp_file($standby->logfile),
	qr/primary server understands receive positions/,
	'the patched standby was not asked for receive positions by the stock primary');
# The stock primary does not report replication_features, so the standby
# never sends it the UNFLUSHED_WAL option, and replays without a cap.
like(slurp_file($node->logfile),
	qr/received replication command: START_REPLICATION .*TIMELINE 1\n/,
	'the stock primary got START_REPLICATION');
unlike(slurp_file($node->logfile), qr/UNFLUSHED_WAL/,
	'the stock primary never sees the UNFLUSHED_WAL option');
# (the standby's catalog is the stock one, without upstream_flush_lsn)
ok(!-f $standby->data_dir . '/global/pg_walrcv_horizon',
	'the patched standby never streamed with the cap from a stock primary');
$standby->stop;
$node->stop;

# A patched primary with a stock synchronous standby.
my $primary = PostgreSQL::Test::Cluster->new('patched_primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', 'CREATE TABLE t (id int, note text)');
$primary->backup('b2');
# A stock standby never asks for unflushed WAL, so it gets flushed WAL only.
# (Set after the backup: the stock standby would refuse the setting in the
# postgresql.conf it copies.)
$primary->append_conf('postgresql.conf',
	"stream_unflushed_wal = written\nlog_replication_commands = on\nfsync = on");
$primary->restart;
my $stock_standby = PostgreSQL::Test::Cluster->new('stock_standby');
$stock_standby->init_from_backup($primary, 'b2', has_streaming => 1);
use_build($stock_standby, $stock);
$stock_standby->start;
is(is_patched($stock_standby), '0', 'the standby runs the stock build');
make_synchronous($primary, 'stock_standby');
# A stock standby offers no EARLY_RECEIPT and sends no receive position, so
# remote_receive is never asked of it and its commits are released at its
# write position.
$primary->safe_psql('postgres',
	"SET synchronous_commit = remote_receive; INSERT INTO t VALUES (1, 'remote_receive')");
$primary->safe_psql('postgres',
	"SET synchronous_commit = remote_apply; INSERT INTO t VALUES (2, 'remote_apply')");
is($stock_standby->safe_psql('postgres', 'SELECT count(*) FROM t'),
	'2', 'a patched primary replicates to a stock synchronous standby');
is( $primary->safe_psql(
		'postgres', q[
	SELECT receive_lsn IS NULL AND write_lsn IS NOT NULL FROM pg_stat_replication
	WHERE application_name = 'stock_standby']),
	't',
	'a stock standby reports no receive position');
is( $primary->safe_psql(
		'postgres', q[
	SELECT send_mode FROM pg_stat_replication
	WHERE application_name = 'stock_standby']),
	'flushed',
	'a stock standby gets flushed WAL from a primary with stream_unflushed_wal');
unlike(slurp_file($primary->logfile), qr/UNFLUSHED_WAL/,
	'the stock standby never asked for unflushed WAL');
ok(!-f $primary->data_dir . '/global/pg_unflushed_sent',
	'the primary never sent unflushed WAL to the stock standby');
# But it warns: the stock standby cannot follow the timeline switch that
# follows a crash once the primary has sent unflushed WAL to another standby.
ok( $primary->wait_for_log(
		qr/WARNING:  standby "stock_standby" cannot follow this server's timeline switch after a crash/
	),
	'the primary warns that the stock standby cannot follow a crash switch');

# A patched standby that accepts unflushed WAL joins, and the primary
# crashes: it switches from timeline 1 to 3.  The patched standby follows;
# the stock standby asks for the history file of the skipped timeline 2 and
# is told why there is none.  (Commits from here on are local: the stock
# synchronous standby will not acknowledge again.)
my $accepting = PostgreSQL::Test::Cluster->new('accepting_standby');
$accepting->init_from_backup($primary, 'b2', has_streaming => 1);
$accepting->append_conf('postgresql.conf', 'wal_receiver_accept_unflushed = on');
$accepting->start;
$primary->poll_query_until('postgres', q[
	SELECT send_mode = 'written' FROM pg_stat_replication
	WHERE application_name = 'accepting_standby'])
  or die 'the accepting standby is not sent unflushed WAL';
$primary->stop('immediate');
$primary->start;
$primary->safe_psql('postgres', 'CHECKPOINT');
is( $primary->safe_psql(
		'postgres', 'SELECT timeline_id FROM pg_control_checkpoint()'),
	'3',
	'the crashed primary switched from timeline 1 to 3');
$primary->safe_psql('postgres',
	"SET synchronous_commit = local; INSERT INTO t VALUES (3, 'timeline 3')");
ok($accepting->poll_query_until('postgres', 'SELECT count(*) = 3 FROM t'),
	'the patched standby follows the crash switch');
ok( $stock_standby->wait_for_log(
		qr/could not receive timeline history file from the primary server: ERROR:  timeline 2 is not in this server's history/
	),
	'the stock standby cannot follow it, and its log says why');
is($stock_standby->safe_psql('postgres', 'SELECT count(*) FROM t'),
	'2', 'the stock standby stays on timeline 1');
unlike(
	slurp_file($primary->logfile),
	qr/standby "accepting_standby" cannot follow/,
	'no warning about the patched standby');
$accepting->stop;
$stock_standby->stop;
$primary->stop;

# --- a data directory made by the patched build on the stock build ------------

# The patched catalog declares the stock statistics functions with their
# stock columns, and gives the views its own *_ext functions.  Stock binaries
# lack those: the views fail with a clean error, and the functions the stock
# build knows keep working.  (When the extra columns were declared on the
# stock functions, a stock backend formed its tuple from past the end of its
# arrays, and crashed on pg_stat_replication with a walsender running.)
my $pdata = PostgreSQL::Test::Cluster->new('patched_data');
$pdata->init(allows_streaming => 1, force_initdb => 1);
$pdata->start;
is(is_patched($pdata), '1', 'the data directory is made by the patched build');
$pdata->safe_psql('postgres',
	"CREATE TABLE t (id int, note text); INSERT INTO t VALUES (1, 'patched')");
$pdata->backup('b3');
$pdata->stop;
use_build($pdata, $stock);
$pdata->start;
is(is_patched($pdata), '0', 'the patched data directory runs on the stock build');
my $pdata_standby = PostgreSQL::Test::Cluster->new('patched_data_standby');
$pdata_standby->init_from_backup($pdata, 'b3', has_streaming => 1);
use_build($pdata_standby, $stock);
$pdata_standby->start;
$pdata->safe_psql('postgres', "INSERT INTO t VALUES (2, 'stock')");
# (not wait_for_replay_catchup: it reads pg_stat_replication, which fails here)
ok( $pdata_standby->poll_query_until(
		'postgres', 'SELECT count(*) = 2 FROM t'),
	'the stock build replicates the patched data directory');
is( $pdata->safe_psql(
		'postgres', 'SELECT count(*) FROM pg_stat_get_wal_senders()'),
	'1',
	'stock pg_stat_get_wal_senders() works on the patched catalog');
is( $pdata_standby->safe_psql(
		'postgres',
		'SELECT status FROM pg_stat_get_wal_receiver()'),
	'streaming',
	'stock pg_stat_get_wal_receiver() works on the patched catalog');
my ($rc, $out, $err) =
  $pdata->psql('postgres', 'SELECT * FROM pg_stat_replication');
like(
	$err,
	qr/internal function "pg_stat_get_wal_senders_ext" is not in internal lookup table/,
	'pg_stat_replication fails cleanly on the stock build');
($rc, $out, $err) =
  $pdata_standby->psql('postgres', 'SELECT * FROM pg_stat_wal_receiver');
like(
	$err,
	qr/internal function "pg_stat_get_wal_receiver_ext" is not in internal lookup table/,
	'pg_stat_wal_receiver fails cleanly on the stock build');
unlike(slurp_file($pdata->logfile), qr/terminated by signal/,
	'no stock backend crashed');
$pdata_standby->stop;
$pdata->stop;
use_build($pdata, undef);
$pdata->start;
is($pdata->safe_psql('postgres', 'SELECT count(*) FROM pg_stat_replication'),
	'0', 'back on the patched build, the views work');
$pdata->stop;

done_testing();
