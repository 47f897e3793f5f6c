// Type declarations for pgsse.js, the browser client for pgsse (README.md).

export declare const VERSION: string;

/** A token, or a function returning a fresh one (called before each connection and before exp). */
export type TokenSource = string | (() => string | Promise<string>);

/** A cursor: decimal digits (ids may exceed 2^53, so they are strings when read back). */
export type Cursor = string | number | bigint;

export interface SubscribeOptions {
  /** One stream to follow. */
  stream?: string;
  /** Several streams on one connection, in an order that is part of the subscription (SPEC §3c). */
  streams?: readonly string[];
  /** pgsse's URL (scheme, host, any path prefix). Default: where this module was loaded from. */
  url?: string | URL;
  /** Event names to listen for besides `message` (addEventListener adds names too). */
  events?: readonly string[];
  /**
   * Where to start when this tab opens the connection: a cursor for every stream, or one per
   * stream. Absent: live only. 0: everything retained.
   */
  since?: Cursor | Readonly<Record<string, Cursor | null | undefined>>;
  /** Sent as ?token=. Absent: the pgsse_token cookie (see withCredentials) or public streams. */
  token?: TokenSource;
  /** Replace the token this many ms before its exp. Default: halfway to exp, 1 s to 2 min before it. */
  refreshBefore?: number;
  /** EventSource's withCredentials: send the pgsse_token cookie to another origin. */
  withCredentials?: boolean;
  /** Ask for pgsse:presence events (SPEC §3d). */
  presence?: boolean;
  /** Share one connection among this origin's tabs (default true; needs Web Locks and BroadcastChannel). */
  share?: boolean;
  /** Tabs share a connection only when this matches too: e.g. the signed-in user's id. */
  shareKey?: string;
}

/** A pgsse:gap: events after `after` up to `resume` of `stream` are gone (pruned). */
export interface GapInfo {
  stream: string;
  after: number;
  resume: number;
}

/** A pgsse:presence: the full list first, then who joined and left (SPEC §3d). */
export interface PresenceInfo {
  stream: string;
  present?: string[];
  join?: string[];
  leave?: string[];
  anonymous: number;
}

/** What listeners of stream events receive. */
export declare class PgsseEvent<J = undefined> extends MessageEvent<string> {
  /** The event's stream; null for an ephemeral event on a several-stream connection. */
  readonly stream: string | null;
  /** The event's id in its stream (decimal digits); null for an ephemeral event. */
  readonly id: string | null;
  /** pgsse:gap and pgsse:presence: the parsed data. */
  readonly json: J;
}

/** An error event; message says what went wrong when the client itself knows. */
export interface PgsseErrorEvent extends Event {
  readonly message?: string;
}

export interface SubscriptionEventMap {
  open: Event;
  error: PgsseErrorEvent;
  statechange: Event;
  message: PgsseEvent;
  'pgsse:gap': PgsseEvent<GapInfo>;
  'pgsse:presence': PgsseEvent<PresenceInfo>;
}

export type Role = 'holder' | 'follower' | 'alone';

export declare class Subscription extends EventTarget {
  constructor(options: SubscribeOptions);
  static readonly CONNECTING: 0;
  static readonly OPEN: 1;
  static readonly CLOSED: 2;
  readonly streams: readonly string[];
  readonly url: string;
  readonly withCredentials: boolean;
  /** 0 connecting, 1 open, 2 closed, as EventSource's (in a follower tab: the holder's). */
  readonly readyState: 0 | 1 | 2;
  /** Whether this tab holds the shared connection; null until it starts (a microtask later). */
  readonly role: Role | null;
  onopen: ((this: Subscription, ev: Event) => unknown) | null;
  onmessage: ((this: Subscription, ev: PgsseEvent) => unknown) | null;
  onerror: ((this: Subscription, ev: PgsseErrorEvent) => unknown) | null;
  /** This tab's position in stream, or undefined before any. */
  cursor(stream: string): string | undefined;
  /** Ends the subscription in this tab; if it held the connection, another tab takes over. */
  close(): void;

  addEventListener<K extends keyof SubscriptionEventMap>(
    type: K,
    listener: (this: Subscription, ev: SubscriptionEventMap[K]) => unknown,
    options?: boolean | AddEventListenerOptions,
  ): void;
  /** Any other name is an event name on the streams: the connection listens for it from now on. */
  addEventListener(
    type: string,
    listener: ((this: Subscription, ev: PgsseEvent) => unknown) | EventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  removeEventListener<K extends keyof SubscriptionEventMap>(
    type: K,
    listener: (this: Subscription, ev: SubscriptionEventMap[K]) => unknown,
    options?: boolean | EventListenerOptions,
  ): void;
  removeEventListener(
    type: string,
    listener: ((this: Subscription, ev: PgsseEvent) => unknown) | EventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
}

/** Follows one stream or several; the options are described in README.md. */
export declare function subscribe(options: SubscribeOptions): Subscription;

// The parts the client is made of, exported for tests and for other transports.

/** Orders two decimal cursors: negative, zero or positive. */
export declare function compareCursors(a: string, b: string): number;

/** Reads a durable event's id on a connection following `count` streams; null if not one. */
export declare function parseEventId(id: string, count: number): { index: number; cursors: string[] } | null;

/** A JWT's exp in ms since 1970 (decoded, not verified), or null. */
export declare function tokenExpiry(token: string): number | null;

/** How long after nowMS a token expiring at expMS is replaced. */
export declare function refreshDelay(expMS: number, nowMS: number, before?: number): number;

/** The EventSource URL of a subscription. */
export declare function subscriptionURL(
  base: string | URL,
  streams: readonly string[],
  options?: { since?: string | null; token?: string | null; presence?: boolean },
): string;

/** One tab's position in each stream: decides which events are new. */
export declare class Cursors {
  constructor(count: number, initial?: ReadonlyArray<string | number | null | undefined> | null);
  get(i: number): string | undefined;
  event(index: number, cursors: readonly string[]): boolean;
  gap(index: number, after: string, resume: string): boolean;
  since(): string | null;
}

/** A message routed by LinkReader. */
export type RoutedMessage =
  | { kind: 'event'; type: string; data: string; lastEventId: string; index: number | null; cursors: string[] | null }
  | { kind: 'gap'; type: 'pgsse:gap'; data: string; index: number; json: GapInfo }
  | { kind: 'presence'; type: 'pgsse:presence'; data: string; index: number; json: PresenceInfo }
  | { kind: 'bad'; reason: string };

/** Routes what one EventSource delivers to the subscription's streams. */
export declare class LinkReader {
  constructor(streams: readonly string[]);
  read(type: string, data: string, lastEventId: string): RoutedMessage;
}
