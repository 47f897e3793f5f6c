// Type declarations for pgsse-hub (index.js, frame.js).
import { EventEmitter } from 'node:events';

export const MAX_BODY: 65536;
export const MAX_NAME: 64;
export const MAX_CHANNEL: 63;
export const HELLO: 0x01, SUB: 0x02, UNSUB: 0x03, PING: 0x04;
export const ACK: 0x81, NOTIFY: 0x82, STATUS: 0x83, PONG: 0x84;
export const TYPE_NAMES: Readonly<Record<number, string>>;
export const LOSSLESS: 0, WAKE: 1;
export const ACK_CODES: Readonly<Record<number, AckCodeName>>;
export const STATUS_CODES: Readonly<Record<number, string>>;
export const READY: 1, LISTENER_DOWN: 2, RESYNC: 3, SHUTDOWN: 4, EVICTED: 5, PROTOCOL_ERROR: 6;

export type AckCodeName = 'OK' | 'BAD_CHANNEL' | 'LISTEN_FAILED' | 'LIMIT' | 'NOT_SUBSCRIBED';
export type FailureReason =
  | 'unavailable' | 'closed' | 'ack_timeout' | 'timeout' | 'evicted' | 'shutdown' | 'protocol'
  | 'closed_by_application';

/** A decoded or to-be-encoded frame; only the fields of its type are meaningful. */
export interface Frame {
  type: number;
  version: number;
  pid: number;
  name: Buffer;
  req: number;
  mode: number;
  channel: Buffer;
  code: number;
  text: Buffer;
  token: bigint;
}

export class ProtocolError extends Error {}
export function frame(type: number, fields?: Partial<Omit<Frame, 'type' | 'token'>> & { token?: bigint | number }): Frame;
/** [frame, bytes used], or [null, 0] while buf holds only part of a frame; throws ProtocolError. */
export function decode(buf: Buffer, start?: number): [Frame, number] | [null, 0];
export function encode(f: Partial<Frame> & { type: number }): Buffer;
export class Decoder {
  feed(data: Buffer): void;
  next(): Frame | null;
}

export class HubFailure extends Error {
  readonly reason: FailureReason;
  readonly detail: string;
}
export class AckError extends Error {
  readonly channel: string;
  readonly code: number;
  readonly codeName: AckCodeName;
  readonly ackMessage: string;
}

export interface Notification {
  channel: string;
  /** The payload decoded as UTF-8. */
  payload: string;
  /** The payload's exact bytes. */
  bytes: Buffer;
  /** The notifying PostgreSQL backend. */
  pid: number;
}

export interface HubEvents {
  notification: [Notification];
  /** pgsse lost its PostgreSQL session: notifications may be missed until 'resync'. */
  down: [];
  /** Re-read the state behind channel (null = every channel). */
  resync: [string | null];
}

export interface HubOptions {
  /** Sent in HELLO, ≤ 64 bytes; default the script's name. */
  name?: string;
  /** LOSSLESS (default) or WAKE. */
  mode?: 0 | 1;
  /** ms, default 2000. */
  connectTimeout?: number;
  /** ms, default 5000: no ACK within it fails the client. */
  ackTimeout?: number;
  /** ms, default 5000, 0 = off: two silent intervals with a PING outstanding fail the client. */
  pingInterval?: number;
}

export class HubClient extends EventEmitter<HubEvents & { failure: [HubFailure] }> {
  static connect(socketPath: string, opts?: HubOptions): Promise<HubClient>;
  readonly failure: HubFailure | null;
  readonly lastDown: boolean;
  /** Resolves with the HubFailure that stopped the client. */
  readonly done: Promise<HubFailure>;
  subscribe(channel: string): Promise<void>;
  unsubscribe(channel: string): Promise<void>;
  ping(timeout?: number): Promise<number>;
  channels(): string[];
  close(): void;
}

/** What the application's own session calls back. */
export interface DirectSink {
  notification(channel: string, payload: string | Buffer, pid: number): void;
  lost(err?: Error): void;
}

/** The application's own LISTEN session (an adapter over its driver). */
export interface DirectSession {
  /** LISTEN with the channel quoted as an identifier; resolves once PostgreSQL answered. */
  listen(channel: string): Promise<unknown>;
  unlisten(channel: string): Promise<unknown>;
  close(): unknown;
}

export interface Logger {
  warn(msg: string): void;
  info(msg: string): void;
  error(msg: string): void;
}

export interface FailoverOptions extends HubOptions {
  /** Opens the application's own session; called only when switching (and to reopen it). */
  direct: (sink: DirectSink) => DirectSession | Promise<DirectSession>;
  /** Default: console.warn and console.error, prefixed `pgsse-hub: `; info dropped. */
  logger?: Logger;
}

export class Failover extends EventEmitter<HubEvents> {
  constructor(socketPath: string, opts: FailoverOptions);
  readonly source: 'hub' | 'direct';
  readonly reason: HubFailure | null;
  readonly directError: Error | null;
  subscribe(channel: string): Promise<void>;
  unsubscribe(channel: string): Promise<void>;
  ping(timeout?: number): Promise<number | null>;
  channels(): string[];
  close(): Promise<void>;
}
