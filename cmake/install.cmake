# install.cmake — `cmake --install` (issue 17): the header, libflce.so (SONAME libflce.so.0), the
# static library, the `flce` tool, a CMake package (find_package(flce CONFIG) gives flce::flce and
# flce::flce_static), flce.pc for pkg-config and the licence (issue 41). Included from the top
# CMakeLists.txt when FLCE_INSTALL is on (the default when flce is the top-level project). Tests
# are not installed.
include(CMakePackageConfigHelpers)
set(FLCE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/flce CACHE STRING
  "Where flceConfig.cmake goes, relative to the prefix")

install(FILES ${PROJECT_SOURCE_DIR}/include/flce.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})  # share/doc/flce
install(TARGETS flce EXPORT flceTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The static library has link requirements (NVRTC, dl, pthread, m) that need CUDAToolkit and
# Threads found by the consumer: a separate export, loaded by the config file when they are found.
install(TARGETS flce_static EXPORT flceStaticTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS flce_tool RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(EXPORT flceTargets NAMESPACE flce:: DESTINATION ${FLCE_INSTALL_CMAKEDIR})
install(EXPORT flceStaticTargets NAMESPACE flce:: DESTINATION ${FLCE_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flceConfig.cmake.in
  ${PROJECT_BINARY_DIR}/flceConfig.cmake INSTALL_DESTINATION ${FLCE_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flceConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flceConfig.cmake ${PROJECT_BINARY_DIR}/flceConfigVersion.cmake
  DESTINATION ${FLCE_INSTALL_CMAKEDIR})

# pkg-config: paths relative to ${prefix}, so that `cmake --install --prefix P` relocates them.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(FLCE_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(FLCE_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  set(FLCE_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(FLCE_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
list(TRANSFORM CMAKE_DL_LIBS PREPEND "-l" OUTPUT_VARIABLE flce_dl)
string(REPLACE ";" " " flce_dl "${flce_dl}")
# NVRTC and NCCL are opened at run time (runtime/dynload.c): not link requirements.
set(FLCE_PC_LIBS_PRIVATE "${flce_dl} -pthread -lm")
# The prefix line is written at install time, from the prefix actually installed to (file(INSTALL)
# adds DESTDIR itself).
file(WRITE ${PROJECT_BINARY_DIR}/flce.pc.body
  "libdir=${FLCE_PC_LIBDIR}\n"
  "includedir=${FLCE_PC_INCLUDEDIR}\n"
  "\n"
  "Name: flce\n"
  "Description: Fused linear + cross-entropy on NVIDIA GPUs (kernels generated at run time, NVRTC)\n"
  "Version: ${PROJECT_VERSION}\n"
  "Libs: -L\${libdir} -lflce\n"
  "Libs.private: ${FLCE_PC_LIBS_PRIVATE}\n"
  "Cflags: -I\${includedir}\n")
install(CODE "
  file(READ \"${PROJECT_BINARY_DIR}/flce.pc.body\" body)
  set(dest \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig\")
  file(WRITE \"${PROJECT_BINARY_DIR}/flce.pc\" \"prefix=\${CMAKE_INSTALL_PREFIX}\\n\${body}\")
  file(INSTALL \"${PROJECT_BINARY_DIR}/flce.pc\" DESTINATION \"\${dest}\")")
