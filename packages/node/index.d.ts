// Type declarations of idempotency-pg (the CommonJS entry point; index.d.mts
// re-exports them for the ESM one).
// Structural types stand in for node-postgres, Node's http and Express, so
// that no other type package is needed.

/** What node-postgres's Client and PoolClient offer that this package uses. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

/** A node-postgres Pool. */
export interface PoolLike {
  connect(): Promise<Queryable & { release(error?: Error | boolean): void }>;
}

/** A request as Node's http (and Express) hands it over. */
export interface RequestLike {
  method?: string;
  url?: string;
  originalUrl?: string;
  headers: Record<string, string | string[] | undefined>;
  rawHeaders?: string[];
  body?: unknown;
  rawBody?: Uint8Array;
  [property: string]: any;
}

/** A response as Node's http (and Express) hands it over. */
export interface ResponseLike {
  statusCode: number;
  setHeader(name: string, value: number | string | readonly string[]): unknown;
  getHeader(name: string): number | string | string[] | undefined;
  end(...args: any[]): unknown;
  [property: string]: any;
}

export type NextFunction = (error?: unknown) => void;

/** What the wrapper adds to the request before the handler runs. */
export interface IdempotencyInfo {
  /** The key, or undefined for a key-less request on a route with required: false. */
  key?: string;
  /** The request's scope as text (null on a SHARED_KEYS route or without a key). */
  scope: string | null;
  /** The key the database holds: scopedKey(scope, key), or key on a SHARED_KEYS route. */
  databaseKey?: string;
  /** The request's fingerprint. */
  requestHash: string;
}

/** The handler's request: the transaction as req.db (or options.property), and req.idempotency. */
export type IdempotentRequest<Req extends RequestLike = RequestLike> =
  Req & { db: Queryable; idempotency: IdempotencyInfo };

export type Handler<Req extends RequestLike = RequestLike, Res extends ResponseLike = ResponseLike> =
  (req: IdempotentRequest<Req>, res: Res, next: NextFunction) => unknown;

/** What the wrapper reports of a keyed request's outcome to onEvent (never the body or the client's key). */
export interface IdempotencyEvent {
  type: 'stored' | 'replayed' | 'conflict' | 'mismatch' | 'gone' | 'not-stored' | 'principal-required';
  /** A level for the application's logger: 'warn' for a mismatch, a scope that threw, a response not storable. */
  level: 'info' | 'warn';
  method?: string;
  /** The request's path, without its query string. */
  path: string;
  /** keyRef(databaseKey): the first 16 hex digits of SHA-256 over the database key. */
  keyRef?: string;
  status?: number;
  /** Why a response was not stored (event 'not-stored'). */
  reason?: 'server-error' | 'not-now' | 'validation' | 'handler-error' | 'response-too-large' | 'passed-on'
    | 'storing-failed';
  /** What the scope function threw (event 'principal-required'). */
  error?: unknown;
}

export interface IdempotentOptions {
  /**
   * The node-postgres Pool the request's transaction is taken from, or a
   * function of the request returning it (a pool made after the routes:
   * (req) => req.app.locals.pool).
   */
  pool: PoolLike | ((req: any) => PoolLike | Promise<PoolLike>);
  /**
   * The request's principal (user, API client, tenant): each principal's keys
   * are its own. Required; SHARED_KEYS shares the route's keys between all
   * clients. A request whose scope is null, undefined or '', or whose scope
   * function throws a TypeError (req.user.id without a user), gets 401.
   */
  scope: ((req: any) => Scope | null | undefined | Promise<Scope | null | undefined>) | typeof SHARED_KEYS;
  /** Answer 400 without an Idempotency-Key (default true). */
  required?: boolean;
  /** Response headers stored and replayed besides Content-Type (default ['Location', 'ETag']). */
  replayHeaders?: string[];
  /** Seconds in the Retry-After of a 409 (default 1). */
  retryAfter?: number;
  /** Store 400/422 answers (default false: they roll back and the key stays free). */
  storeValidationErrors?: boolean;
  /** The statuses storeValidationErrors is about (default [400, 422]). */
  validationStatuses?: readonly number[];
  /** idempotency.wait_timeout for the claim: milliseconds, or a text such as '2s'. */
  waitTimeout?: number | string;
  /** idempotency.ttl of the request's key: milliseconds, or an interval's text such as '15 minutes'. */
  ttl?: number | string;
  /** Largest response body stored (default 1 MiB); larger ones are refused with 500. */
  maxBodyBytes?: number;
  /** Largest request body the wrapper reads itself (default 1 MiB); larger ones get 413. */
  maxRequestBytes?: number;
  /** Prefix of the problem documents' type URIs (default DEFAULT_PROBLEM_BASE, 'urn:idempotency:problem:'). */
  problemBase?: string;
  /** The request property that holds the transaction handle (default 'db'). */
  property?: string;
  /** Called with errors the handler raises after its response was settled. */
  onLateError?: (error: unknown, req: RequestLike) => void;
  /** Gets each keyed request's outcome (default: written to stderr when NODE_DEBUG=idempotency-pg). */
  onEvent?: (event: IdempotencyEvent, req: RequestLike) => void;
}

/** The default prefix of problem types: 'urn:idempotency:problem:'. */
export const DEFAULT_PROBLEM_BASE: string;
/** The keyRef of events: the first 16 hex digits of SHA-256 over a database key. */
export function keyRef(databaseKey: string): string;

/**
 * Wraps an Express (or Node http) handler: claims the Idempotency-Key in a
 * transaction, runs the handler with the transaction as req.db, stores and
 * commits its response, or replays a stored one.
 */
export function idempotent<Req extends RequestLike = RequestLike, Res extends ResponseLike = ResponseLike>(
  options: IdempotentOptions, handler: Handler<Req, Res>): (req: Req, res: Res, next: NextFunction) => void;

/** Sends a stored response document again, with Idempotent-Replayed: true. */
export function replay(res: ResponseLike, document: StoredResponse): void;

export interface ClaimResult {
  replayed: boolean;
  response: any;
  createdAt: Date | null;
  expiresAt: Date | null;
}

/** Claims key in the client's open transaction. */
export function claim(client: Queryable, key: string, requestHash?: string | null,
  options?: { waitTimeout?: number | string; ttl?: number | string }): Promise<ClaimResult>;
/** Stores response for the key this transaction claimed. */
export function complete(client: Queryable, key: string, response: unknown): Promise<void>;
/** Lets go of this transaction's claim without storing anything. */
export function release(client: Queryable, key: string): Promise<void>;
/** SET LOCAL idempotency.wait_timeout, for the rest of the transaction. */
export function setWaitTimeout(client: Queryable, waitTimeout: number | string): Promise<void>;
/** SET LOCAL idempotency.ttl (milliseconds, or an interval's text), for the rest of the transaction. */
export function setTtl(client: Queryable, ttl: number | string): Promise<void>;

/** Runs work once per key in a transaction of its own; returns its (stored) result. */
export function withIdempotency<T>(db: PoolLike | Queryable,
  options: { key: string; requestHash?: string | null; waitTimeout?: number | string; ttl?: number | string },
  work: (db: Queryable) => Promise<T> | T): Promise<{ replayed: boolean; response: T }>;

export interface RequestParts {
  method: string;
  /** "/path?query" as the request line has it. */
  requestTarget: string;
  contentType?: string;
  body?: unknown;
}
/** The shared request fingerprint (hex SHA-256). */
export function fingerprint(parts: RequestParts): string;
export function requestFingerprint(req: RequestLike): string;
export function canonicalJson(value: unknown): string;
/** A body parser `verify` hook that keeps the raw bytes for the fingerprint. */
export function keepRawBody(req: RequestLike, res: unknown, buffer: Uint8Array): void;

/** A request's principal for scopedKey: a non-empty string or an integer. */
export type Scope = string | number | bigint;
/** The scope option of a route whose keys are shared by every client. */
export const SHARED_KEYS: { readonly __sharedKeys?: never; toString(): string };
/** The database key of a client's key within a scope (the shared rule of packages/shared/scope-vectors.json). */
export function scopedKey(scope: Scope | typeof SHARED_KEYS, key: string): string;

export function parseKey(value: string): { key: string; error?: undefined } | { key?: undefined; error: string };
export function readKey(req: RequestLike): { key?: string; missing?: true; error?: string };
export const MAX_KEY_BYTES: number;

export function isStored(status: number,
  options?: { storeValidationErrors?: boolean; validationStatuses?: readonly number[] }): boolean;
export const NEVER_STORED: readonly number[];
export const DEFAULT_VALIDATION_STATUSES: readonly number[];

export interface StoredResponse {
  status: number;
  headers?: Record<string, string | string[]>;
  body?: string;
  body_encoding?: 'base64';
}
export function storedDocument(status: number, headers: Record<string, string | string[]>,
  body: Uint8Array): StoredResponse;
export function decodeBody(document: StoredResponse): Uint8Array;

export class IdempotencyError extends Error {
  code: string;
  status?: number;
}
export class KeyInProgressError extends IdempotencyError { status: 409; }
/** IK410: the request already ran and its response is no longer kept; it must not run again. */
export class KeyGoneError extends IdempotencyError { status: 410; }
export class KeyReusedError extends IdempotencyError { status: 422; }
export class InvalidKeyError extends IdempotencyError { status: 400; }
export class SealedError extends IdempotencyError {}

export * from './consumer';
