'use strict';
// Attaches a receiver to ADDRESS (which may hold no message) and drains it.
//
//   node drain.js HOST PORT ADDRESS CREDIT [--timeout=S] [--username=U [--password=P]]
//
// Once the link is open: receiver.drain = true; receiver.add_credit(CREDIT), then waits for
// rhea's "receiver_drained" event (a flow from the server with drain set and link-credit 0).
// A server must answer a drain at once: with the messages it has (up to CREDIT), then the flow
// that uses up the rest of the credit.  Each message is accepted.  (rhea only reports the end of
// a drain on such a flow: if the messages use up all the credit, a server that sends no flow
// afterwards leaves rhea waiting until the timeout.)  roundtrip.js --drain-first checks that a
// link goes on working after a drain.
//
// Prints {"received":N,"indices":[...],"drained":true,"drain_events":D,"credit_after_drain":0,
//         "delivery_count_after_drain":DC,"elapsed_ms":T,"warnings":[]}
// (received counts the messages that arrived before the drained event; elapsed_ms, from the
// drain request to the drained event, is for information only).

const common = require('./common.js');

const args = common.parseArgs('drain.js', [], '');
const credit = args.count;
if (credit < 1) common.fail(2, 'CREDIT must be at least 1');

const result = {
    received: 0,
    indices: [],
    drained: false,
    drain_events: 0,
    credit_after_drain: null,
    delivery_count_after_drain: null,
    elapsed_ms: null,
};
let drainRequestedAt = null;
let phase = 'attaching'; // attaching -> draining -> done

const { connection, finish } = common.connect(args, () =>
    `${phase}: ${JSON.stringify(result)}`);

const receiver = connection.open_receiver({
    source: { address: args.address },
    credit_window: 0,
    autoaccept: true,
});

receiver.on('receiver_open', () => {
    phase = 'draining';
    drainRequestedAt = process.hrtime.bigint();
    receiver.drain = true;
    receiver.add_credit(credit);
});

receiver.on('message', (context) => {
    result.received += 1;
    result.indices.push(common.indexOf(context.message));
});

receiver.on('receiver_drained', () => {
    result.drain_events += 1;
    if (phase !== 'draining') return;
    result.drained = true;
    result.elapsed_ms = Number(process.hrtime.bigint() - drainRequestedAt) / 1e6;
    result.credit_after_drain = receiver.credit;
    result.delivery_count_after_drain = receiver.delivery_count;
    phase = 'done';
    finish(result);
});
