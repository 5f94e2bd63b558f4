// The clients scenario from pgjdbc (see test/clients/run): `?` placeholders,
// values set with setInt/setLong/setString/setObject/setNull as an
// application does; server-side prepared statements (prepareThreshold=1,
// or -1: prepared and binary from the first execution).
//
//   java -cp .:postgresql.jar Scenario JDBC_URL
import java.math.BigDecimal;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;

public class Scenario {
  static final String PREFIX = System.getenv("CLIENTS_RUN") + "-" + System.getenv("CLIENTS_CONFIG") + "-";
  static final int ACCOUNT = Integer.parseInt(System.getenv("CLIENTS_ACCOUNT"));
  // The same instant as the other drivers', written at another offset.
  static final OffsetDateTime STAMP = OffsetDateTime.of(2026, 1, 2, 5, 4, 5, 0, ZoneOffset.ofHours(2));
  static final UUID ID = UUID.fromString("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
  static final String DOC = "{\"a\": 1, \"b\": [true, null]}";

  static void result(String step, String field, Object value) {
    System.out.println("RESULT " + step + " " + field + " " + value);
  }

  interface Body {
    void run() throws Exception;
  }

  static void step(String name, Body body) {
    try {
      body.run();
    } catch (SQLException e) {
      result(name, "error", (e.getSQLState() + " " + e.getMessage()).replace('\n', ' '));
    } catch (Exception e) {
      result(name, "error", e.toString().replace('\n', ' '));
    }
  }

  // docs:begin pgjdbc
  static final String CALL_WITHDRAW =
      "SELECT idempotency.idempotent_call(?, NULL, 'SELECT withdraw($1, $2)', ?, ?)::text,"
          + " idempotency.last_call_replayed()";

  record Outcome(String response, boolean replayed) {}

  static Outcome withdraw(Connection conn, String key, int account, long amount) throws SQLException {
    try (PreparedStatement call = conn.prepareStatement(CALL_WITHDRAW)) {
      call.setString(1, key);
      call.setInt(2, account);
      call.setLong(3, amount);
      try (ResultSet rs = call.executeQuery()) {
        rs.next();
        return new Outcome(rs.getString(1), rs.getBoolean(2)); // {"account": 7, "balance": 9700}, false
      }
    } catch (SQLException e) {
      if ("IK409".equals(e.getSQLState())) throw new SQLException("busy: retry later with the same key (409)", "IK409", e);
      if ("IK422".equals(e.getSQLState())) throw new SQLException("key reused for another request (422)", "IK422", e);
      throw e;
    }
  }
  // docs:end pgjdbc

  static final String CALL_TYPES =
      "SELECT idempotency.idempotent_call(?, NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)', ?, ?, ?, ?, ?, ?)::text,"
          + " idempotency.last_call_replayed()";

  static void report(String name, PreparedStatement call) throws SQLException {
    try (ResultSet rs = call.executeQuery()) {
      rs.next();
      result(name, "response", rs.getString(1));
      result(name, "replayed", rs.getBoolean(2));
    }
  }

  static void setTypes(PreparedStatement call, String key, String tag) throws SQLException {
    call.setString(1, key);
    call.setString(2, tag);
    call.setBoolean(3, true);
    call.setObject(4, STAMP);
    call.setObject(5, ID);
    call.setObject(6, DOC, Types.OTHER);
    call.setBigDecimal(7, new BigDecimal("12.50"));
  }

  static void execute(Connection conn, String sql) throws SQLException {
    try (Statement statement = conn.createStatement()) {
      statement.execute(sql);
    }
  }

  public static void main(String[] args) throws Exception {
    Connection conn = DriverManager.getConnection(args[0]);
    Connection other = DriverManager.getConnection(args[0] + "&ApplicationName=clients-holder");

    String first = PREFIX + "first";
    for (String name : new String[] {"first", "retry"}) {
      step(name, () -> {
        try {
          Outcome outcome = withdraw(conn, first, ACCOUNT + 1, 300);
          result(name, "response", outcome.response());
          result(name, "replayed", outcome.replayed());
        } catch (SQLException e) {
          throw e.getCause() instanceof SQLException cause ? cause : e;
        }
      });
    }
    step("conflict", () -> {
      try (PreparedStatement call = conn.prepareStatement(CALL_WITHDRAW)) {
        call.setString(1, first);
        call.setInt(2, ACCOUNT + 1);
        call.setLong(3, 301);
        call.executeQuery().close();
      } catch (SQLException e) {
        result("conflict", "sqlstate", e.getSQLState());
      }
    });

    step("busy", () -> {
      String key = PREFIX + "busy";
      other.setAutoCommit(false);
      try (PreparedStatement hold = other.prepareStatement(CALL_WITHDRAW);
          PreparedStatement call = conn.prepareStatement(CALL_WITHDRAW)) {
        for (PreparedStatement s : new PreparedStatement[] {hold, call}) {
          s.setString(1, key);
          s.setInt(2, ACCOUNT + 2);
          s.setLong(3, 100);
        }
        hold.executeQuery().close();
        long started = System.nanoTime();
        try {
          call.executeQuery().close();
        } catch (SQLException e) {
          result("busy", "sqlstate", e.getSQLState());
        }
        result("busy", "elapsed_ms", (System.nanoTime() - started) / 1_000_000);
        other.commit();
        report("busy_after", call);
      } finally {
        other.setAutoCommit(true);
      }
    });

    step("handler", () -> {
      String key = PREFIX + "handler";
      conn.setAutoCommit(false);
      try (PreparedStatement claim = conn.prepareStatement("SELECT replayed, response::text FROM idempotency.claim(?, ?)");
          PreparedStatement work = conn.prepareStatement("SELECT withdraw(?, ?)::text");
          PreparedStatement complete = conn.prepareStatement("SELECT idempotency.complete(?, ?)")) {
        claim.setString(1, key);
        claim.setString(2, "hash-1");
        try (ResultSet rs = claim.executeQuery()) {
          rs.next();
          result("handler_claim", "replayed", rs.getBoolean(1));
        }
        work.setInt(1, ACCOUNT + 3);
        work.setLong(2, 50);
        String response;
        try (ResultSet rs = work.executeQuery()) {
          rs.next();
          response = rs.getString(1);
        }
        result("handler_work", "response", response);
        complete.setString(1, key);
        complete.setObject(2, response, Types.OTHER);
        complete.executeQuery().close();
        conn.commit();
        try (ResultSet rs = claim.executeQuery()) {
          rs.next();
          result("handler_again", "replayed", rs.getBoolean(1));
          result("handler_again", "response", rs.getString(2));
        }
        conn.commit();
      } finally {
        conn.rollback();
        conn.setAutoCommit(true);
      }
    });

    step("release", () -> {
      String key = PREFIX + "release";
      conn.setAutoCommit(false);
      try (PreparedStatement claim = conn.prepareStatement("SELECT replayed FROM idempotency.claim(?, ?)");
          PreparedStatement release = conn.prepareStatement("SELECT idempotency.release(?)");
          PreparedStatement lookup = conn.prepareStatement("SELECT state FROM idempotency.lookup(?)")) {
        claim.setString(1, key);
        claim.setNull(2, Types.OTHER); // no request_hash
        claim.executeQuery().close();
        release.setString(1, key);
        release.executeQuery().close();
        conn.commit();
        lookup.setString(1, key);
        try (ResultSet rs = lookup.executeQuery()) {
          rs.next();
          result("release_lookup", "state", rs.getString(1));
        }
        conn.commit();
        try (ResultSet rs = claim.executeQuery()) {
          rs.next();
          result("release_again", "replayed", rs.getBoolean(1));
        }
      } finally {
        conn.rollback();
        conn.setAutoCommit(true);
      }
    });

    // Three keys, the second with a null request hash, in one transaction:
    // withdraw for each claimed key, the answers as createArrayOf("jsonb").
    // Then the batch again with the first key repeated under another hash.
    String[] batchKeys = {PREFIX + "batch-0", PREFIX + "batch-1", PREFIX + "batch-2"};
    String[] batchHashes = {"hash-0", null, "hash-2"};
    step("batch", () -> {
      conn.setAutoCommit(false);
      try (PreparedStatement claim = conn.prepareStatement(
              "SELECT outcome FROM idempotency.claim_batch(?, ?) ORDER BY ordinality");
          PreparedStatement work = conn.prepareStatement("SELECT withdraw(?, ?)::text");
          PreparedStatement complete = conn.prepareStatement("SELECT idempotency.complete_batch(?, ?)")) {
        claim.setArray(1, conn.createArrayOf("text", batchKeys));
        claim.setArray(2, conn.createArrayOf("text", batchHashes));
        List<String> outcomes = new ArrayList<>();
        try (ResultSet rs = claim.executeQuery()) {
          while (rs.next()) outcomes.add(rs.getString(1));
        }
        List<String> keys = new ArrayList<>();
        List<String> responses = new ArrayList<>();
        for (int i = 0; i < outcomes.size(); i++) {
          result("batch." + i, "outcome", outcomes.get(i));
          if (!outcomes.get(i).equals("claimed")) continue;
          work.setInt(1, ACCOUNT + 6 + i);
          work.setLong(2, 10 * (i + 1));
          try (ResultSet rs = work.executeQuery()) {
            rs.next();
            result("batch." + i, "response", rs.getString(1));
            keys.add(batchKeys[i]);
            responses.add(rs.getString(1));
          }
        }
        complete.setArray(1, conn.createArrayOf("text", keys.toArray()));
        complete.setArray(2, conn.createArrayOf("jsonb", responses.toArray()));
        complete.executeQuery().close();
        conn.commit();
      } finally {
        conn.rollback();
        conn.setAutoCommit(true);
      }
    });
    step("batch_retry", () -> {
      conn.setAutoCommit(false);
      try (PreparedStatement claim = conn.prepareStatement(
              "SELECT outcome, sqlstate, response::text FROM idempotency.claim_batch(?, ?) ORDER BY ordinality")) {
        claim.setArray(1, conn.createArrayOf("text",
            new String[] {batchKeys[0], batchKeys[1], batchKeys[2], batchKeys[0]}));
        claim.setArray(2, conn.createArrayOf("text",
            new String[] {batchHashes[0], batchHashes[1], batchHashes[2], "hash-0-other"}));
        try (ResultSet rs = claim.executeQuery()) {
          for (int i = 0; rs.next(); i++) {
            result("batch_retry." + i, "outcome", rs.getString(1));
            result("batch_retry." + i, "sqlstate", rs.getString(2));
            result("batch_retry." + i, "response", rs.getString(3));
          }
        }
        conn.commit();
      } finally {
        conn.rollback();
        conn.setAutoCommit(true);
      }
    });

    try (PreparedStatement call = conn.prepareStatement(CALL_TYPES)) {
      String key = PREFIX + "types";
      setTypes(call, key, key);
      for (String name : new String[] {"types", "types_retry"}) step(name, () -> report(name, call));
    }
    try (PreparedStatement call = conn.prepareStatement(CALL_TYPES)) {
      String key = PREFIX + "types-null";
      call.setString(1, key);
      call.setString(2, key);
      call.setNull(3, Types.BOOLEAN);
      call.setObject(4, null);
      call.setNull(5, Types.OTHER);
      call.setObject(6, null);
      call.setNull(7, Types.NUMERIC);
      for (String name : new String[] {"types_null", "types_null_retry"}) step(name, () -> report(name, call));
    }

    String[][] prepared = {{"prepared", "auto", "4"}, {"prepared_generic", "force_generic_plan", "5"}};
    for (String[] p : prepared) {
      step(p[0], () -> {
        execute(conn, "SET plan_cache_mode = " + p[1]);
        try (PreparedStatement call = conn.prepareStatement(CALL_WITHDRAW)) {
          for (String run : new String[] {"run", "retry"}) {
            for (int i = 0; i < 20; i++) {
              call.setString(1, PREFIX + p[0] + "-" + i);
              call.setInt(2, ACCOUNT + Integer.parseInt(p[2]));
              call.setLong(3, i + 1);
              try (ResultSet rs = call.executeQuery()) {
                rs.next();
                result(p[0] + "." + run + "." + i, "response", rs.getString(1));
              }
            }
          }
        }
        execute(conn, "RESET plan_cache_mode");
      });
    }

    // Cross-driver: setLong (int8) where psql wrote an int literal, and
    // setString (varchar; untyped with stringtype=unspecified) for the amount.
    try (PreparedStatement call = conn.prepareStatement(CALL_WITHDRAW)) {
      call.setString(1, System.getenv("CLIENTS_CROSS_KEY"));
      call.setLong(2, Long.parseLong(System.getenv("CLIENTS_CROSS_ACCOUNT")));
      call.setString(3, "250");
      step("cross", () -> report("cross", call));
    }
    try (PreparedStatement call = conn.prepareStatement(CALL_TYPES)) {
      setTypes(call, System.getenv("CLIENTS_CROSS_KEY") + "-types", System.getenv("CLIENTS_CROSS_TAG"));
      step("cross_types", () -> report("cross_types", call));
    }
    other.close();
    conn.close();
  }
}
