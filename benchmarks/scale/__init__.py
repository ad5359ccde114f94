"""Scale curves of a Pulsar-protocol broker (Magnetar or pulsar-lite) with the official ``pulsar-client``.

Measurements (every loop bounded in count and time; loopback only):

* ``topics``   N topics, each with one non-batched producer and one durable subscription with a connected
               consumer, idle after creation: broker RSS per topic, broker CPU while idle, and the broker
               CPU per message of a non-batched publish to one of them (N=1 is the lone-topic baseline).
* ``load``     time (and broker CPU) to load N topics by creating their first producers, to unload their
               namespace through the admin REST API (Magnetar), and to reload them when the clients reconnect.
* ``subs``     1..S subscriptions (one consumer each) on one topic: broker CPU per published message
               delivered to all of them.
* ``backlog``  one subscription without a consumer while the backlog grows (e.g. 0, 100k, 1M messages):
               broker CPU per published message and broker RSS.

Broker start/stop, CPU and RSS come from ``benchmarks.bench``; the measured publishes run in a separate
client process (``benchmarks.bench.workers.producer_worker``); the idle producers and consumers live in
this process. Results print as tables, optionally go to JSON, and ``--plots DIR`` draws PNGs with
matplotlib (``python -m benchmarks.scale.plots RESULTS.json DIR`` redraws them from a JSON file).

    python -m benchmarks.scale --target magnetar --quick
    python -m benchmarks.scale --target both --topics 1,100,1000,10000 --plots docs/img --json /tmp/scale.json
"""
