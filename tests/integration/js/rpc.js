'use strict';
// Request-reply over Direct Reply-To (RabbitMQ 4.2) on one connection: a responder reads
// requests from ADDRESS and answers each to its reply-to through a null-target sender (each
// reply's `to`); a requester takes replies on a dynamic source with the capability
// rabbitmq:volatile-queue, pre-settled, and sends COUNT requests to ADDRESS with that reply-to.
//
//   node rpc.js HOST PORT ADDRESS COUNT [--timeout=S] [--username=U [--password=P]]
//
// Prints {"reply_address":A,"sent":N,"replied":R,"replies":N,"indices":[...],
//         "correlated":true,"warnings":[]}

const common = require('./common.js');

const args = common.parseArgs('rpc.js', [], '');
const result = { reply_address: null, sent: 0, replied: 0, replies: 0, indices: [], correlated: true };
const { connection, finish } = common.connect(args, () => JSON.stringify(result));

function maybeDone() {
    if (result.replies === args.count && result.replied === args.count) finish(result);
}

// The responder: every request is answered to its reply-to, then accepted.
const anonymous = connection.open_sender({ target: {} });
anonymous.on('accepted', () => {
    result.replied += 1;
    maybeDone();
});
const requests = connection.open_receiver({ source: { address: args.address }, autoaccept: true });
requests.on('message', (context) => {
    const request = context.message;
    anonymous.send({
        to: request.reply_to,
        correlation_id: request.message_id,
        body: `reply ${request.body}`,
    });
});

// The requester.
const replies = connection.open_receiver({
    source: {
        dynamic: true,
        capabilities: ['rabbitmq:volatile-queue'],
        expiry_policy: 'link-detach',
        durable: 0,
        timeout: 0,
    },
    snd_settle_mode: 1,
    credit_window: Math.max(args.count, 1),
});
replies.on('message', (context) => {
    const reply = context.message;
    const index = Number(reply.correlation_id);
    if (reply.body !== `reply ${index}`) result.correlated = false;
    result.indices.push(index);
    result.replies += 1;
    maybeDone();
});
replies.on('receiver_open', (context) => {
    result.reply_address = context.receiver.source.address;
    const sender = connection.open_sender({ target: { address: args.address } });
    sender.on('sendable', () => {
        while (result.sent < args.count && sender.sendable()) {
            sender.send({
                message_id: String(result.sent),
                reply_to: result.reply_address,
                body: String(result.sent),
            });
            result.sent += 1;
        }
    });
    if (args.count === 0) maybeDone();
});
