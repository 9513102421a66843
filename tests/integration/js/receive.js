'use strict';
// Attaches a receiver to ADDRESS and takes COUNT messages from it.
//
//   node receive.js HOST PORT ADDRESS COUNT [--credit-window=W | --credit=C]
//                   [--settle=at-least-once|at-most-once] [--idle=S]
//                   [--timeout=S] [--username=U [--password=P]]
//
// Credit: --credit-window=W uses rhea's own flow controller (credit topped up to W as messages
// arrive; rhea's default is 1000); --credit=C turns it off and grants credit by hand with
// receiver.add_credit(): C at a time, each batch only once the previous one is used up, never
// more than COUNT in all (default: --credit-window=1000).
// Settlement: at-least-once (default) asks for unsettled transfers (snd-settle-mode unsettled)
// and accepts each of the first COUNT messages; at-most-once asks for pre-settled transfers
// (snd-settle-mode settled).  Messages past COUNT (possible with a credit window) are released.
// --idle=S: after the COUNT-th message, wait S seconds more and report what else arrived.
//
// Prints {"received":N,"indices":[...],"delivery_counts":[...],"first_acquirers":F,
//         "presettled":P,"body_types":{...},"extra":E,"credit_left":C,"warnings":[]}
// where indices are the messages' "i" (in arrival order), delivery_counts the header
// delivery-count of each, presettled how many transfers arrived already settled, and extra how
// many arrived past COUNT (and were released).

const common = require('./common.js');

const args = common.parseArgs('receive.js', ['credit-window', 'credit', 'settle', 'idle'],
    '[--credit-window=W | --credit=C] [--settle=at-least-once|at-most-once] [--idle=S]');
if (args.opts['credit-window'] !== undefined && args.opts.credit !== undefined) {
    common.fail(2, '--credit-window and --credit exclude each other');
}
const manualCredit = common.intOption(args.opts, 'credit', 0, 1);
const creditWindow = manualCredit ? 0 : common.intOption(args.opts, 'credit-window', 1000, 1);
const settle = common.choiceOption(args.opts, 'settle', ['at-least-once', 'at-most-once']);
const idleSeconds = Number(args.opts.idle === undefined ? 0 : args.opts.idle);
if (!(idleSeconds >= 0)) common.fail(2, `bad --idle: ${args.opts.idle}`);

const result = {
    received: 0,
    indices: [],
    delivery_counts: [],
    first_acquirers: 0,
    presettled: 0,
    body_types: {},
    extra: 0,
    credit_left: null,
};
let granted = 0;
let done = false;

const { connection, finish } = common.connect(args, () =>
    `received ${result.received} of ${args.count}, last index ${result.indices.at(-1)}`);

const receiver = connection.open_receiver({
    source: { address: args.address },
    credit_window: creditWindow,
    autoaccept: false,
    snd_settle_mode: settle === 'at-most-once' ? 1 : 0,
    rcv_settle_mode: 0,
});

function grant() {
    if (!manualCredit || receiver.credit > 0 || granted >= args.count) return;
    const n = Math.min(manualCredit, args.count - granted);
    granted += n;
    receiver.add_credit(n);
}

function complete() {
    if (done) return;
    done = true;
    const report = () => {
        result.credit_left = receiver.credit;
        finish(result);
    };
    if (idleSeconds > 0) setTimeout(report, idleSeconds * 1000);
    else report();
}

receiver.on('receiver_open', () => {
    grant();
    if (args.count === 0) complete();
});

receiver.on('message', (context) => {
    const { message, delivery } = context;
    if (delivery.remote_settled) result.presettled += 1;
    if (result.received >= args.count) {
        result.extra += 1;
        // A pre-settled transfer only needs settling locally (rhea keeps it in the session's
        // incoming buffer, which is its incoming window, until it is).
        if (delivery.remote_settled) delivery.update(true);
        else delivery.release();
        return;
    }
    result.received += 1;
    result.indices.push(common.indexOf(message));
    result.delivery_counts.push(message.delivery_count === undefined ? 0 : message.delivery_count);
    if (message.first_acquirer) result.first_acquirers += 1;
    const type = common.bodyType(message);
    result.body_types[type] = (result.body_types[type] || 0) + 1;
    // For a pre-settled transfer this settles it locally and sends nothing.
    delivery.accept();
    if (result.received === args.count) complete();
    else grant();
});
