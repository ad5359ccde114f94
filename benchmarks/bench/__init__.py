"""Benchmark a Pulsar-protocol broker (Magnetar or pulsar-lite) with the official ``pulsar-client``.

Scenarios (all bounded in time or count):

* ``publish-<size>``          non-batched publish throughput, send_async with bounded outstanding messages
* ``publish-batched-<size>``  batched publish throughput (1000 msgs / 128 KiB / 10 ms batches)
* ``consume-<size>``          drain a pre-filled backlog of non-batched messages (one message per entry)
* ``consume-batched-<size>``  drain a pre-filled backlog written in batches
* ``fanout-<size>``           publish non-batched while 4 subscriptions (one consumer process each) read live;
                              µs per *published* message cover its four deliveries and acks
* ``fanout-batched-<size>``   the same with batched publishing
* ``latency-<rate>``          end-to-end latency at a fixed publish rate (timestamp in the payload)

For every scenario the broker's CPU time (utime+stime of the broker process tree, from /proc) is read
before and after the measured window, giving µs of broker CPU per message and messages per broker
CPU-second; the broker tree's VmRSS is sampled every ~0.5 s during each row (median and peak MiB per
row and over the run, and their Magnetar/pulsar-lite ratios). Clients run in separate processes
(``spawn``) so that the measuring process stays idle and several producers can work in parallel: one
Python producer process saturates at ~1.1 cores here.

Run from the repository root. Modules: ``main`` (command line), ``brokers``, ``workers`` (client
processes), ``scenarios`` (orchestration and measurement), ``procfs`` (CPU accounting), ``memory``
(broker RSS sampling), ``results`` and ``report``. Examples::

    python -m benchmarks.bench --target pulsar-lite
    python -m benchmarks.bench --target both --json /tmp/bench.json
    python -m benchmarks.bench --target magnetar --quick --scenarios publish,latency
    python -m benchmarks.bench --service-url pulsar://127.0.0.1:6650 --broker-pid 1234
"""
