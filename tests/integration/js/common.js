'use strict';
// Shared plumbing for the rhea interop scripts driven by tests/integration/test_rhea.py.
//
// Every script takes:   HOST PORT ADDRESS COUNT [--option=value ...]
// prints exactly one JSON line on stdout when it succeeds (exit 0), and otherwise exits
// non-zero with a one-line reason on stderr (bad arguments: 2, protocol/connection error: 1,
// timeout: 3).  Anything rhea itself reports on console.error (e.g. "Received transfer when
// credit was 0", "received flow with drain set, but non zero credit") is a sign that the server
// broke the protocol: it is collected into the "warnings" field of the result.
//
// Common options:
//   --timeout=SECONDS     give up (exit 3) after this long (default 15)
//   --username=NAME       use SASL (rhea only does SASL when given a user name): ANONYMOUS,
//   --password=SECRET     or PLAIN when a password is given too
//   --container-id=ID     AMQP container id (default: rhea's random uuid)

const rhea = require('rhea');

const warnings = [];
const originalError = console.error;
console.error = function (...args) {
    warnings.push(args.map(String).join(' '));
};

function fail(code, text) {
    process.stderr.write(String(text).replace(/\s+$/, '') + '\n');
    if (warnings.length) process.stderr.write('rhea warnings: ' + JSON.stringify(warnings) + '\n');
    process.exit(code);
}

function usage(script, extra) {
    return `usage: node ${script} HOST PORT ADDRESS COUNT [--timeout=S] [--username=U] ` +
        `[--password=P]${extra ? ' ' + extra : ''}`;
}

// Parses argv into {host, port, address, count, opts}; opts holds the --key=value options
// (a bare --flag is "true").  `known` lists the script's own option names.
function parseArgs(script, known, extraUsage) {
    const positional = [];
    const opts = {};
    const allowed = new Set(['timeout', 'username', 'password', 'container-id', ...known]);
    for (const arg of process.argv.slice(2)) {
        if (arg.startsWith('--')) {
            const eq = arg.indexOf('=');
            const key = eq < 0 ? arg.slice(2) : arg.slice(2, eq);
            if (!allowed.has(key)) fail(2, `unknown option --${key}\n${usage(script, extraUsage)}`);
            opts[key] = eq < 0 ? 'true' : arg.slice(eq + 1);
        } else {
            positional.push(arg);
        }
    }
    if (positional.length !== 4) fail(2, usage(script, extraUsage));
    const [host, portText, address, countText] = positional;
    const port = Number(portText);
    const count = Number(countText);
    if (!Number.isInteger(port) || port <= 0 || port > 65535) fail(2, `bad port: ${portText}`);
    if (!Number.isInteger(count) || count < 0) fail(2, `bad count: ${countText}`);
    return { host, port, address, count, opts };
}

function intOption(opts, name, fallback, min) {
    if (opts[name] === undefined) return fallback;
    const value = Number(opts[name]);
    if (!Number.isInteger(value) || value < (min === undefined ? 0 : min)) {
        fail(2, `bad --${name}: ${opts[name]}`);
    }
    return value;
}

function choiceOption(opts, name, choices) {
    const value = opts[name] === undefined ? choices[0] : opts[name];
    if (!choices.includes(value)) fail(2, `bad --${name}: ${value} (one of ${choices.join(', ')})`);
    return value;
}

// Opens a connection (no reconnect: an error must fail the run, not be retried) and arms the
// timeout.  `describe` returns a short text of the progress so far, for the timeout message.
function connect(args, describe) {
    const seconds = Number(args.opts.timeout === undefined ? 15 : args.opts.timeout);
    if (!(seconds > 0)) fail(2, `bad --timeout: ${args.opts.timeout}`);
    const timer = setTimeout(() => {
        fail(3, `timeout after ${seconds}s: ${describe ? describe() : ''}`);
    }, seconds * 1000);
    const container = rhea.create_container();
    const options = { host: args.host, port: args.port, reconnect: false };
    if (args.opts.username !== undefined) options.username = args.opts.username;
    if (args.opts.password !== undefined) options.password = args.opts.password;
    if (args.opts['container-id'] !== undefined) options.container_id = args.opts['container-id'];
    container.on('error', (err) => fail(1, `error: ${err && err.message ? err.message : err}`));
    const connection = container.connect(options);
    let finished = false;
    connection.on('disconnected', (context) => {
        if (!finished) {
            const err = context.error ? `: ${context.error.message || context.error}` : '';
            fail(1, `disconnected before the run completed${err}`);
        }
    });
    connection.on('connection_error', (context) => {
        const e = context.connection.error;
        fail(1, `connection error: ${e ? JSON.stringify(e) : 'unknown'}`);
    });
    for (const name of ['sender_error', 'receiver_error', 'session_error']) {
        connection.on(name, (context) => {
            const link = context.sender || context.receiver || context.session;
            const e = link && link.error;
            fail(1, `${name}: ${e ? JSON.stringify(e) : 'unknown'}`);
        });
    }
    // Prints the result, closes the connection politely and exits 0 once it is closed (or after a
    // short grace period if the server does not answer the close).
    function finish(result) {
        if (finished) return;
        finished = true;
        clearTimeout(timer);
        result.warnings = warnings;
        process.stdout.write(JSON.stringify(result) + '\n');
        const exit = () => process.exit(0);
        setTimeout(exit, 2000).unref();
        connection.on('connection_close', exit);
        connection.on('disconnected', exit);
        connection.close();
    }
    return { container, connection, finish };
}

// The index a message carries: application property "i", else its body as a number.
function indexOf(message) {
    const props = message.application_properties;
    if (props && props.i !== undefined && props.i !== null) return Number(props.i);
    let body = message.body;
    if (body && body.typecode !== undefined) body = body.content; // a data section
    if (Buffer.isBuffer(body)) body = body.toString('utf8');
    const n = Number(body);
    return Number.isInteger(n) ? n : null;
}

function bodyType(message) {
    const body = message.body;
    if (body && body.typecode === 0x75) return 'data';
    if (Buffer.isBuffer(body)) return 'binary';
    if (typeof body === 'string') return 'string';
    return body === undefined || body === null ? 'none' : typeof body;
}

module.exports = {
    rhea,
    warnings,
    originalError,
    fail,
    parseArgs,
    intOption,
    choiceOption,
    connect,
    indexOf,
    bodyType,
};
