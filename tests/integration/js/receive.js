'use strict';
// Attaches a receiver to ADDRESS and takes COUNT messages from it.
//
//   node receive.js HOST PORT ADDRESS COUNT [--credit-window=W | --credit=C]
//                   [--settle=at-least-once|at-most-once] [--idle=S]
//                   [--selector=JMS] [--sql=SQL] [--stream-filter=V1,V2,...] [--offset=SPEC]
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
// Filters (the source's filter set, as rhea and RabbitMQ's clients name them): --selector puts
// a JMS selector under "jms-selector" (rhea.filter.selector), --sql an AMQP SQL filter under
// "sql-filter" (descriptor 0x120), --stream-filter RabbitMQ's stream filter values, --offset a
// stream's rabbitmq:stream-offset-spec ("first", "last", "next" or an offset).
//
// Prints {"received":N,"indices":[...],"delivery_counts":[...],"first_acquirers":F,
//         "presettled":P,"body_types":{...},"extra":E,"credit_left":C,"filters":[...],
//         "warnings":[]}
// where indices are the messages' "i" (in arrival order), delivery_counts the header
// delivery-count of each, presettled how many transfers arrived already settled, and extra how
// many arrived past COUNT (and were released), and filters the keys of the filter set the
// server echoed (the filters it applies).

const common = require('./common.js');

const args = common.parseArgs('receive.js',
    ['credit-window', 'credit', 'settle', 'idle', 'selector', 'sql', 'stream-filter', 'offset'],
    '[--credit-window=W | --credit=C] [--settle=at-least-once|at-most-once] [--idle=S] ' +
    '[--selector=JMS] [--sql=SQL] [--stream-filter=V1,V2] [--offset=SPEC]');
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
    filters: [],
};
const types = common.rhea.types;
const filter = {};
if (args.opts.selector !== undefined) Object.assign(filter, common.rhea.filter.selector(args.opts.selector));
if (args.opts.sql !== undefined) filter['sql-filter'] = types.wrap_described(args.opts.sql, 0x120);
if (args.opts['stream-filter'] !== undefined) {
    filter['rabbitmq:stream-filter'] = types.wrap_described(
        args.opts['stream-filter'].split(','), 'rabbitmq:stream-filter');
}
if (args.opts.offset !== undefined) {
    const spec = /^[0-9]+$/.test(args.opts.offset) ? types.wrap_ulong(Number(args.opts.offset))
        : args.opts.offset;
    filter['rabbitmq:stream-offset-spec'] = types.wrap_described(spec, 'rabbitmq:stream-offset-spec');
}
let granted = 0;
let done = false;

const { connection, finish } = common.connect(args, () =>
    `received ${result.received} of ${args.count}, last index ${result.indices.at(-1)}`);

const receiver = connection.open_receiver({
    source: Object.keys(filter).length ? { address: args.address, filter } : { address: args.address },
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
    const echoed = receiver.source && receiver.source.filter;
    result.filters = echoed ? Object.keys(echoed).sort() : [];
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
