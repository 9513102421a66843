'use strict';
// Publishes COUNT messages to ADDRESS and waits for the outcome of every one of them.
//
//   node send.js HOST PORT ADDRESS COUNT [--start=K] [--body=string|binary|data]
//                [--settled] [--durable] [--senders=N [--link-name=NAME]] [--timeout=S]
//                [--username=U [--password=P]]
//
// With --senders=N the messages go round robin over N sender links of one session, each
// attached once the one before is, all named NAME when --link-name is given (RabbitMQ accepts
// repeated link names; rhea matches an ATTACH reply to the newest link of its name).
// Message i (for i = K .. K+COUNT-1) has application property i = <i> and a body holding the
// text of <i>: an AMQP string (default), a binary amqp-value (--body=binary) or a data section
// (--body=data).  Sends as fast as the link credit and the session window allow.  Without
// --settled it prints, once every delivery is settled by the server:
//   {"sent":N,"accepted":A,"rejected":R,"released":L,"modified":M,"no_outcome":0,"warnings":[]}
// With --settled (at-most-once: pre-settled transfers) it prints as soon as all are written.

const common = require('./common.js');

const args = common.parseArgs('send.js',
    ['start', 'body', 'settled', 'durable', 'senders', 'link-name'],
    '[--start=K] [--body=string|binary|data] [--settled] [--durable] [--senders=N] ' +
    '[--link-name=NAME]');
const start = common.intOption(args.opts, 'start', 0);
const bodyKind = common.choiceOption(args.opts, 'body', ['string', 'binary', 'data']);
const presettled = args.opts.settled === 'true';
const durable = args.opts.durable === 'true';
const senderCount = common.intOption(args.opts, 'senders', 1);
const linkName = args.opts['link-name'];

const result = { sent: 0, accepted: 0, rejected: 0, released: 0, modified: 0, no_outcome: 0 };
const settledCount = () =>
    result.accepted + result.rejected + result.released + result.modified + result.no_outcome;

const { connection, finish } = common.connect(args, () => JSON.stringify(result));

function makeBody(i) {
    const text = String(i);
    if (bodyKind === 'binary') return Buffer.from(text, 'utf8');
    if (bodyKind === 'data') return common.rhea.message.data_section(Buffer.from(text, 'utf8'));
    return text;
}

function maybeDone() {
    if (result.sent !== args.count) return;
    if (presettled || settledCount() === args.count) finish(result);
}

const senders = [];

function openSender() {
    const options = {
        target: { address: args.address },
        snd_settle_mode: presettled ? 1 : 0,
        // Count "modified" on its own instead of folding it into "released".
        treat_modified_as_released: false,
    };
    if (linkName !== undefined) options.name = linkName;
    const sender = connection.open_sender(options);
    senders.push(sender);
    sender.on('sendable', pump);
    sender.on('sender_open', () => {
        if (senders.length < senderCount) openSender();
        else if (args.count === 0) maybeDone();
    });
    // Counted when the server settles a delivery, by the outcome it gave (none: settled with
    // no outcome at all, which a server should not do for an unsettled transfer in mode
    // "first").
    sender.on('settled', (context) => {
        const state = context.delivery.remote_state;
        const outcome = state && state.constructor && state.constructor.composite_type;
        if (outcome && Object.prototype.hasOwnProperty.call(result, outcome) &&
            outcome !== 'sent') {
            result[outcome] += 1;
        } else {
            result.no_outcome += 1;
        }
        maybeDone();
    });
}

function pump() {
    while (result.sent < args.count && senders.length === senderCount) {
        const sender = senders[result.sent % senders.length];
        if (!sender.sendable()) break;
        const i = start + result.sent;
        const msg = { body: makeBody(i), application_properties: { i } };
        if (durable) msg.durable = true;
        sender.send(msg);
        result.sent += 1;
    }
    maybeDone();
}

openSender();
