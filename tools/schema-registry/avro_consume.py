#!/usr/bin/env python3
"""Reads whole Kafka topics written in Avro with a schema registry, as a
Confluent consumer would: Confluent's Python client (confluent_kafka, on
librdkafka) with its own AvroDeserializer and SchemaRegistryClient, so that
pgwal's Avro output is checked by a reader that pgwal's code had no hand in.

    avro_consume.py --brokers HOST:PORT --registry URL [--timeout S] TOPIC...

URL is the registry's Confluent API base, e.g.
http://127.0.0.1:8081/apis/ccompat/v7 (tools/schema-registry-server start).
Runs in the venv of `tools/schema-registry-server consumer-env`.

Reads every partition of each topic from its start up to its end as known
at the start (read_committed: the last stable offset), with a fresh group,
committing nothing; a topic that does not exist is empty.  Prints one JSON
line per record, in topic (as given), partition and offset order:

    {"topic", "partition", "offset", "key", "value",
     "key_schema_id", "value_schema_id"}

Keys and values are the deserialised Avro data (a null key or value, e.g. a
tombstone, stays null, with a null schema id); the schema ids are those of
Confluent's framing (byte 0 the magic 0, then a 4-byte big-endian id).
What JSON lacks is written as text: bytes and fixed as base64, decimals as
their str(), dates, times and timestamps in ISO 8601, UUIDs as str(), and
NaN and the infinities as "NaN", "Infinity" and "-Infinity".

Exits 1, naming the topic, partition and offset, at the first key or value
not in Confluent's framing or that fails to deserialise; exits 1 too on a
broker error or when the end is not reached within --timeout seconds.
"""

import argparse
import base64
import datetime
import decimal
import json
import math
import os
import sys
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


class Failure(Exception):
    pass


def plain(v):
    """v as JSON can hold it."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        # serde_json, like JSON, has no NaN
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def framed_id(data, what, where):
    """The schema id of Confluent's framing of data."""
    if len(data) < 5 or data[0] != 0:
        raise Failure(
            f"{where}: the {what} is not in Confluent's framing "
            f"({len(data)} bytes, starting {data[:5].hex() or 'with nothing'})"
        )
    return int.from_bytes(data[1:5], "big")


def decode(deserializer, msg, field, where):
    data = msg.key() if field == MessageField.KEY else msg.value()
    if data is None:
        return None, None
    what = "key" if field == MessageField.KEY else "value"
    schema_id = framed_id(data, what, where)
    try:
        obj = deserializer(data, SerializationContext(msg.topic(), field, msg.headers()))
    except Exception as e:  # the deserialiser's or the registry client's
        raise Failure(f"{where}: the {what} (schema id {schema_id}) does not deserialise: {type(e).__name__}: {e}")
    return plain(obj), schema_id


def ends(consumer, topics, deadline):
    """(TopicPartition, high) of each non-empty partition, high as now known."""
    out = []
    for t in topics:
        md = consumer.list_topics(topic=t, timeout=max(1.0, deadline - time.monotonic()))
        tm = md.topics.get(t)
        if tm is None or tm.error is not None:
            if tm is not None and tm.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise Failure(f"topic {t}: {tm.error}")
            continue  # no such topic: empty
        for p in sorted(tm.partitions):
            tp = TopicPartition(t, p)
            # read_committed: librdkafka asks for the last stable offset
            low, high = consumer.get_watermark_offsets(
                tp, timeout=max(1.0, deadline - time.monotonic()), cached=False
            )
            if high > low:
                out.append((tp, high))
    return out


def read(args):
    deadline = time.monotonic() + args.timeout
    registry = SchemaRegistryClient({"url": args.registry})
    keys = AvroDeserializer(registry)
    values = AvroDeserializer(registry)
    consumer = Consumer(
        {
            "bootstrap.servers": args.brokers,
            "group.id": f"avro-consume-{os.getpid()}-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        wanted = ends(consumer, args.topics, deadline)
        records = []
        if wanted:
            consumer.assign([TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp, _ in wanted])
        while wanted:
            # read_committed stops at the last stable offset, and transaction
            # markers take offsets that no record shows: done when the
            # position, not the last record's offset, reaches the end
            pos = consumer.position([tp for tp, _ in wanted])
            if all(p.offset >= high for p, (_, high) in zip(pos, wanted)):
                break
            if time.monotonic() > deadline:
                left = ", ".join(f"{p.topic}[{p.partition}] at {p.offset} of {high}" for p, (_, high) in zip(pos, wanted))
                raise Failure(f"the ends were not reached within {args.timeout} s: {left}")
            for msg in consumer.consume(num_messages=500, timeout=0.2):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise Failure(f"topic {msg.topic()} partition {msg.partition()}: {msg.error()}")
                where = f"topic {msg.topic()} partition {msg.partition()} offset {msg.offset()}"
                key, key_id = decode(keys, msg, MessageField.KEY, where)
                value, value_id = decode(values, msg, MessageField.VALUE, where)
                records.append(
                    {
                        "topic": msg.topic(),
                        "partition": msg.partition(),
                        "offset": msg.offset(),
                        "key": key,
                        "value": value,
                        "key_schema_id": key_id,
                        "value_schema_id": value_id,
                    }
                )
    finally:
        consumer.close()
    order = {t: i for i, t in enumerate(args.topics)}
    records.sort(key=lambda r: (order[r["topic"]], r["partition"], r["offset"]))
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", required=True, help="bootstrap.servers, e.g. 127.0.0.1:9092")
    ap.add_argument("--registry", required=True, help="the registry's Confluent API base URL")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to reach the ends (default 120)")
    ap.add_argument("topics", nargs="+", metavar="TOPIC")
    args = ap.parse_args()
    try:
        records = read(args)
    except Failure as e:
        print(f"avro_consume: {e}", file=sys.stderr)
        return 1
    out = sys.stdout
    for r in records:
        out.write(json.dumps(r, separators=(",", ":")) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
