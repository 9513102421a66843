'use strict';
// RabbitMQ 4's management over AMQP as a JS client drives it: a link pair on /management
// (properties {paired: true}, requests pre-settled with reply-to "$me"), then
// PUT /queues/ADDRESS with x-queue-type TYPE, COUNT messages published to /queues/ADDRESS,
// GET /queues/ADDRESS and DELETE /queues/ADDRESS. Each reply's status code (its subject) and
// body are reported as they came: a client that reads any answer as success (RabbitMQ's JS
// client read a 501 so) only works if every code is the one RabbitMQ gives.
//
//   node management.js HOST PORT ADDRESS COUNT [--type=classic|quorum|stream]
//
// Prints {"declared":{"status":"201","body":{...}},"published":N,
//         "info":{"status":"200","body":{...}},"deleted":{"status":"200","body":{...}},
//         "warnings":[]}

const common = require('./common.js');

const args = common.parseArgs('management.js', ['type'], '[--type=classic|quorum|stream]');
const type = common.choiceOption(args.opts, 'type', ['classic', 'quorum', 'stream']);
const result = { declared: null, published: 0, info: null, deleted: null };
const { connection, finish } = common.connect(args, () => JSON.stringify(result));

const path = `/queues/${encodeURIComponent(args.address)}`;
const pair = { name: 'management-link-pair', properties: { paired: true } };
const requests = connection.open_sender({
    ...pair,
    target: { address: '/management' },
    snd_settle_mode: 1,
});
// rhea keeps one link per name until it is open: the receiver half follows the sender's ATTACH.
let replies = null;
requests.on('sender_open', () => {
    replies = connection.open_receiver({
        ...pair,
        source: { address: '/management' },
        autoaccept: false,
        credit_window: 1,
    });
    replies.on('message', (context) => {
        const reply = context.message;
        waiting.shift()({ status: reply.subject, body: reply.body === undefined ? null : reply.body });
    });
    replies.on('receiver_open', run);
});
const waiting = [];
let next = 0;

function request(method, to, body) {
    return new Promise((resolve) => {
        waiting.push(resolve);
        next += 1;
        requests.send({ message_id: `request-${next}`, to, subject: method, reply_to: '$me', body });
    });
}


function publish() {
    if (args.count === 0) return Promise.resolve();
    return new Promise((resolve) => {
        const sender = connection.open_sender({ target: { address: path } });
        let sent = 0;
        sender.on('sendable', () => {
            while (sent < args.count && sender.sendable()) {
                sender.send({ body: `m${sent}`, durable: true });
                sent += 1;
            }
        });
        sender.on('accepted', () => {
            result.published += 1;
            if (result.published === args.count) sender.close();
        });
        sender.on('sender_close', () => resolve());
    });
}

let started = false;
function run() {
    if (started || replies === null || !requests.sendable() || !replies.is_open()) return;
    started = true;
    const declaration = { durable: true, exclusive: false, auto_delete: false,
        arguments: { 'x-queue-type': type } };
    request('PUT', path, declaration)
        .then((declared) => { result.declared = declared; return publish(); })
        .then(() => request('GET', path, null))
        .then((info) => { result.info = info; return request('DELETE', path, null); })
        .then((deleted) => { result.deleted = deleted; finish(result); });
}
requests.on('sendable', run);
