'use strict';
// Sends COUNT messages to ADDRESS and receives them back on the same connection (one session,
// a sender and a receiver link).
//
//   node roundtrip.js HOST PORT ADDRESS COUNT [--credit-window=W] [--drain-first]
//                     [--timeout=S] [--username=U [--password=P]]
//
// The receiver (rhea flow controller with window W, default 100) is attached first; with
// --drain-first it first drains the (empty) queue and waits for the drained event, then goes on
// with its credit window.  The sender then publishes messages i = 0..COUNT-1 (string body, "i"
// property) and the receiver accepts each one.
//
// Prints {"sent":N,"accepted":A,"received":R,"indices":[...],"drained_first":bool,
//         "received_before_drain":0,"warnings":[]}

const common = require('./common.js');

const args = common.parseArgs('roundtrip.js', ['credit-window', 'drain-first'],
    '[--credit-window=W] [--drain-first]');
const creditWindow = common.intOption(args.opts, 'credit-window', 100, 1);
const drainFirst = args.opts['drain-first'] === 'true';

const result = {
    sent: 0,
    accepted: 0,
    received: 0,
    indices: [],
    drained_first: false,
    received_before_drain: 0,
};
let sending = false;

const { connection, finish } = common.connect(args, () => JSON.stringify(result));

function maybeDone() {
    if (result.received === args.count && result.accepted === args.count) finish(result);
}

const receiver = connection.open_receiver({
    source: { address: args.address },
    // With --drain-first the window is opened by hand once the drain is over.
    credit_window: drainFirst ? 0 : creditWindow,
    autoaccept: true,
});
let sender = null;

function startSending() {
    if (sending) return;
    sending = true;
    sender = connection.open_sender({ target: { address: args.address } });
    const pump = () => {
        while (result.sent < args.count && sender.sendable()) {
            sender.send({ body: String(result.sent), application_properties: { i: result.sent } });
            result.sent += 1;
        }
    };
    sender.on('sendable', pump);
    sender.on('accepted', () => {
        result.accepted += 1;
        maybeDone();
    });
    if (args.count === 0) maybeDone();
}

receiver.on('receiver_open', () => {
    if (drainFirst) {
        receiver.drain = true;
        receiver.add_credit(creditWindow);
    } else {
        startSending();
    }
});

receiver.on('receiver_drained', () => {
    if (!drainFirst || result.drained_first) return;
    result.drained_first = true;
    result.received_before_drain = result.received;
    receiver.drain = false;
    // From here on keep the window open by hand, as rhea's flow controller would.
    receiver.add_credit(creditWindow);
    receiver.on('message', () => {
        const missing = creditWindow - receiver.credit;
        if (missing >= creditWindow / 4) receiver.add_credit(missing);
    });
    startSending();
});

receiver.on('message', (context) => {
    result.received += 1;
    result.indices.push(common.indexOf(context.message));
    maybeDone();
});
